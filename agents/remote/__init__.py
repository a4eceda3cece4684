"""Negotiators across HTTP: the server that serves any negotiator, its JSON wire format, and the client."""
