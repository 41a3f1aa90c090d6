"""DiffusionNER: entities denoised from K noisy spans (boundary diffusion, DDIM sampling)."""

from nerserve.ner.archs.base import ArchitectureSpec, Capabilities, Tuning
from nerserve.ner.archs.diffusion.config import DiffusionConfig, DiffusionDecodeOptions
from nerserve.ner.archs.diffusion.program import DiffusionProgram
from nerserve.ner.archs.diffusion.signatures import signatures

SPEC = ArchitectureSpec(
    name="diffusion",
    config=DiffusionConfig,
    options=DiffusionDecodeOptions,
    program=DiffusionProgram,
    signatures=signatures,
    capabilities=Capabilities(nested=True),
    int8_graphs=("encoder", "denoiser"),
    # φ/3: the paper's 2.5/3 ≈ 0.83 (tuned in [2.5, 2.7]); a CPU-trained model is less confident
    tuning=Tuning({"threshold": tuple(round(0.1 + 0.05 * i, 2) for i in range(17))}),
    network="nerserve.ner.archs.diffusion.network:DiffusionNetwork",
    trainer="nerserve.ner.training.diffusion_trainer:train_diffusion",
)
