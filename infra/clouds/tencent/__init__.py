"""Tencent Cloud (CVM, COS, SCF): everything gpufleet knows about this cloud."""
