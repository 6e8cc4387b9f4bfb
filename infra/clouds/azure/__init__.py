"""Azure (VMs, Blob storage, Functions): everything gpufleet knows about this cloud."""
