"""Language-model negotiators: prompt templates, the chat layout, reply parsing, the negotiator, its backends, and the
``vllm serve`` line for a registered chat model."""
