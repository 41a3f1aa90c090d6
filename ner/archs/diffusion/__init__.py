"""DiffusionNER: entities denoised from K noisy spans (boundary diffusion, DDIM sampling)."""

from ner.archs.base import ArchitectureSpec, Capabilities, Tuning
from ner.archs.diffusion.config import DiffusionConfig, DiffusionDecodeOptions
from ner.archs.diffusion.program import DiffusionProgram
from ner.archs.diffusion.signatures import signatures

SPEC = ArchitectureSpec(
    name="diffusion",
    config=DiffusionConfig,
    options=DiffusionDecodeOptions,
    program=DiffusionProgram,
    signatures=signatures,
    capabilities=Capabilities(nested=True),
    # φ/3: the paper's 2.5/3 ≈ 0.83 (tuned in [2.5, 2.7]); a CPU-trained model is less confident
    tuning=Tuning({"threshold": tuple(round(0.1 + 0.05 * i, 2) for i in range(17))}),
    network="ner.archs.diffusion.network:DiffusionNetwork",
    trainer="ner.training.diffusion_trainer:train_diffusion",
)
