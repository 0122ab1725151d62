"""The tiny Gemma 3's pieces (``python -m vlmrl.testing.tiny --family gemma3``): Gemma 3's special tokens, its
newline tokens and chat template on the tiny tokenizer's trained vocabulary, ``Gemma3Processor`` with
``Gemma3ImageProcessor`` resizing each image to one 56-px square (pan-and-scan off, as the hub's processors have it),
and a ``Gemma3Config`` of the tiny shape: a SigLIP tower (14-px patches) average-pooled to 4 tokens an image, and a
Gemma 3 decoder with 1-D RoPE (two bases), a sliding-window layer and a global one, and bidirectional attention
inside each image's tokens."""

from __future__ import annotations

from typing import Any

from vlmrl.testing import tiny_parts

SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
]
"""Gemma 3's special tokens that vlmrl reads, appended after the trained vocabulary."""

EXTRA_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
"""The tokenizer attributes ``Gemma3Processor`` reads its image tokens from (Gemma's tokenizer config names them so)."""

NEWLINES = tuple("\n" * k for k in range(1, 5))
"""Runs of newlines that are one token each in Gemma's vocabulary ("\\n" to "\\n\\n\\n\\n"): the processor writes an
image as ``\\n\\n<start_of_image>...<end_of_image>\\n\\n`` in the text, and the newlines merge with their neighbours'
when it is tokenized (``models.tiles.GemmaTiling.join``)."""

END_TOKENS = ("<end_of_turn>", "<eos>")
"""What ends a model turn (Gemma 3's generation config: ``<eos>`` and ``<end_of_turn>``)."""

IMAGE_SIZE = 56
"""Pixels a side of an image (the hub's: 896)."""
TOKENS_PER_IMAGE = 4
"""Image tokens after the projector's average pooling: 4 x 4 patches pooled 2 x 2 (the hub's: 256)."""
SLIDING_WINDOW = 24
"""The sliding-window layer's window (the hub's 4B: 1024): shorter than the tests' sequences, so the window acts."""

# Gemma 3's chat template (the -it checkpoints' chat_template.json), its whitespace kept
CHAT_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}{%- endif -%}"
    '{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = "" -%}'
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    '{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}{%- endif -%}'
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}{%- elif item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}{%- else -%}{{ raise_exception(\"Invalid content type\") }}"
    "{%- endif -%}{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}"
    "{%- endif -%}"
)


def tokenizer(trained: Any) -> Any:
    """Gemma's tokenizer around a trained ``tokenizers.Tokenizer`` that already carries :data:`SPECIAL_TOKENS`: the
    newline runs added as single tokens (:data:`NEWLINES`), the image tokens named as ``Gemma3Processor`` reads them."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    trained.add_tokens([AddedToken(t, special=False, normalized=False) for t in NEWLINES])
    return PreTrainedTokenizerFast(
        tokenizer_object=trained,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[3:],
        extra_special_tokens=EXTRA_TOKENS,
        model_max_length=32768,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def processor(tok: Any) -> Any:
    """``Gemma3Processor``: each image resized to :data:`IMAGE_SIZE` px square (pan-and-scan off),
    :data:`TOKENS_PER_IMAGE` tokens each."""
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    ip = Gemma3ImageProcessor(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_pan_and_scan=False,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    return Gemma3Processor(
        image_processor=ip, tokenizer=tok, image_seq_length=TOKENS_PER_IMAGE, chat_template=CHAT_TEMPLATE
    )


def config(tok: Any, spec: Any, text_shape: dict) -> Any:
    """A ``Gemma3Config`` of the spec's shape (``text_shape``: ``tiny.text_shape``): a sliding-window layer then a
    global one (the hub's: five then one), a SigLIP tower of the spec's sizes."""
    from transformers import Gemma3Config

    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    layers = int(text_shape["num_hidden_layers"])
    text = dict(
        **text_shape,
        head_dim=spec.hidden // spec.heads,
        query_pre_attn_scalar=spec.hidden // spec.heads,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        },
        pad_token_id=ids["<pad>"],
        eos_token_id=[ids[t] for t in END_TOKENS],
        bos_token_id=ids["<bos>"],
        tie_word_embeddings=spec.tie_word_embeddings,
    )
    vision = dict(**tiny_parts.vit_sizes(spec), image_size=IMAGE_SIZE, patch_size=14, vision_use_head=False)
    return Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
        tie_word_embeddings=spec.tie_word_embeddings,
    )


def init_weights(model: Any, std: float = 0.02) -> None:
    """The projector's weight drawn at random: transformers initialises Gemma 3's ``mm_input_projection_weight`` to
    zeros (a checkpoint always holds it trained), which would hand the decoder every image as zeros."""
    import torch

    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, std)
