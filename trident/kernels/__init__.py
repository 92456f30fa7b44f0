"""Kernels trident itself launches (barriers, copies), written with the public device API."""
