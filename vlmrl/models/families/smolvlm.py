"""SmolVLM (``smolvlm``: SmolVLM2) and Idefics3 (``idefics3``: SmolVLM v1 and Idefics3, the same architecture and
prompt layout with ``Idefics3Processor``): a SigLIP tower over square tiles (each image scaled to the processor's
``size`` and cut into a grid of ``max_image_size`` tiles, plus a global view), pixel shuffle by the config's
``scale_factor`` to ``image_seq_len`` tokens a tile, a linear connector, and a Llama decoder with plain 1-D RoPE.

What differs from the Qwen path: images are not resized by the dataset (the processor tiles them), an image's single
``<image>`` becomes a grid of ``<fake_token_around_image><row_r_col_c>`` + ``image_seq_len`` x ``<image>`` with a
newline after each row and the global view behind ``<global-img>`` (``models.tiles.GridTiling``), positions are one
per token, and the features come out of ``get_image_features`` tile by tile. The vision start and end are one token
(``<fake_token_around_image>``), and Idefics3's tokenizers have no video token. vlmrl trains it on images and text;
videos (SmolVLM2 writes them as timestamped frames of image tokens) and multi-turn tool rollouts (Qwen's hermes
turns) are refused by name."""

from vlmrl.models import tiles
from vlmrl.models.families.base import Family

ROW_COL_TOKENS = tuple(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))
"""The grid's position tokens (SmolVLM's tokenizers hold rows and columns 1 to 6)."""

SMOLVLM = Family(
    name="smolvlm",
    label="SmolVLM",
    model_types=("smolvlm", "idefics3"),
    patch_size=16,
    vision_tokens=("<image>", "<video>", "<fake_token_around_image>", "<fake_token_around_image>"),
    never_sample=("<global-img>", *ROW_COL_TOKENS),
    image_processor_classes=tuple(
        f"{name}ImageProcessor{kind}" for name in ("SmolVLM", "Idefics3") for kind in ("", "Fast", "Pil")
    ),
    videos=False,
    tool_turns=False,
    processor_classes=("SmolVLMProcessor", "Idefics3Processor"),
    mrope=False,
    tiles=tiles.GRID,
    vision_modules=("vision_model", "connector"),
    text_model="text_model",
    vision_blocks="vision_model.encoder.layers",
)
