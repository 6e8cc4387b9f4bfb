"""AWS (EC2, S3, Lambda): everything gpufleet knows about this cloud."""
