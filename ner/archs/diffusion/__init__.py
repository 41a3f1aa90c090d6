"""DiffusionNER: entities denoised from K noisy spans (boundary diffusion, DDIM sampling)."""
