"""What every training stack trains and how its state is compared: the LLaMA model (tensor-parallel, or as pipeline
layers), the synthetic data every layout trains on, and the digests that verify a restored state. Imports torch."""
