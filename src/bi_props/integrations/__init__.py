"""Other projects' code and formats: switch providers (verl), the vllm-ascend source contract, the
vLLM engine runner, and the Triton compatibility layer and CPU backend.

Imported on whichever side needs them; the third-party packages themselves are imported lazily.
"""
