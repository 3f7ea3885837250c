"""Other projects' code and formats: switch providers (verl) and the vllm-ascend source contract.
The vLLM engine runner and the Triton helpers live in ``bi_props.targets`` (only targets use
them).

Imported on whichever side needs them; the third-party packages themselves are imported lazily.
"""
