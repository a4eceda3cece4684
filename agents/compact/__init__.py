"""The tiny in-process seller: the compact word protocol, its negotiator and its decoder."""
