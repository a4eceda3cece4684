"""Rule-based negotiators: the strategies, their shared base and the outcome search they use."""
