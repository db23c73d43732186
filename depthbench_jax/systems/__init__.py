"""The systems cost of depth: FLOPs, KV cache, parameter and peak memory, device-hours."""
