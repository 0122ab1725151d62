"""GLM-4.1V (``glm4v``): Qwen2-VL's vision side in GLM's clothes. 14-px patches merged 2 x 2 (28-px tokens) from
flattened ``pixel_values`` and ``image_grid_thw`` as Qwen's, 3-D M-RoPE positions as Qwen2-VL's (a partial rotary
dimension in the checkpoint's config), a GLM-4 decoder; its own vision tokens (``<|begin_of_image|><|image|>
<|end_of_image|>``) and chat template (``[gMASK]<sop><|user|>...<|assistant|>``), and an image processor whose
pixel bounds count an image as two frames.

Its videos are written as frames of the IMAGE token behind whole-second timestamps inside ``<|begin_of_video|>`` ...
``<|end_of_video|>``, a layout vlmrl's prompts and positions do not build yet (and in a prompt holding images too,
transformers' forward cannot tell a video's features from an image's); vlmrl trains it on images and text, and
refuses videos (the config gate's ``rollout.limit_videos``, the dataset's records) and multi-turn tool rollouts (Qwen's
hermes turns) by name."""

from vlmrl.models.families.base import Family

GLM4V = Family(
    name="glm4v",
    label="GLM-4.1V",
    model_types=("glm4v",),
    patch_size=14,
    vision_tokens=("<|image|>", "<|video|>", "<|begin_of_image|>", "<|end_of_image|>"),
    never_sample=("<|begin_of_video|>", "<|end_of_video|>"),
    image_processor_classes=("Glm4vImageProcessor", "Glm4vImageProcessorFast", "Glm4vImageProcessorPil"),
    pixel_frames=2,
    videos=False,
    tool_turns=False,
    hf_repeat_prompts=True,
    config_requires=(("text_config.attention_bias", True),),
    processor_classes=("Glm4vProcessor",),
)
