"""Alibaba Cloud (ECS, OSS, Function Compute): everything gpufleet knows about this cloud."""
