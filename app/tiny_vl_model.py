"""Builder for the tiny local vision-language model that the image tests run on; nothing is
downloaded.

The architecture is PaddleOCR-VL (`PaddleOCRVLForConditionalGeneration`), Qwen2-VL's
design on other parts: a SigLIP-style vision tower whose 2x2 merging projector feeds a
language model with M-RoPE, and the same image block, start marker + one pad token per
merged 28x28 patch + end marker. Qwen2-VL itself cannot run on the CPU build: vLLM's
Qwen2-VL module and transformers' Qwen2-VL processor both import torchvision, and no
torchvision wheel matches the CPU torch that vLLM pins (see ENGINE-NOTES). PaddleOCR-VL's
vLLM module and processor need only PIL and numpy.

What is built: random weights (vision tower of 2 blocks, width 64; language model of 2
layers, hidden 128), the tiny model's BPE tokenizer plus Qwen2-VL's vision markers (the
tokens keep Qwen's names: the ids are what the protocol sees), a chat template that
renders an image part as `<|vision_start|><|image_pad|><|vision_end|>`, and a
`preprocessor_config.json` for the image processor with small pixel bounds, so that an
image becomes between `MIN_IMAGE_TOKENS` and `MAX_IMAGE_TOKENS` pad tokens (a 56x56
image: 4). The weights are written under the names of the published PaddleOCR-VL
checkpoints (`visual.`, `mlp_AR.`, `model.`, `lm_head.`), which is what vLLM loads.

The same seed gives the same files. torch and safetensors are imported inside the
builder so that importing this module stays cheap.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.tiny_model import SPECIAL_TOKENS, build_tokenizer

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VISION_TOKENS = [VISION_START, VISION_END, IMAGE_PAD, "<|video_pad|>"]

PATCH_SIZE = 14
MERGE_SIZE = 2
_UNIT = PATCH_SIZE * MERGE_SIZE  # one pad token covers a 28x28 square of the resized image
MIN_IMAGE_TOKENS = 4
MAX_IMAGE_TOKENS = 16
# CLIP's normalisation, as the PaddleOCR-VL and Qwen2-VL processors use.
_IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
_IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]

_TEXT = {"hidden": 128, "intermediate": 256, "layers": 2, "heads": 4, "kv_heads": 2}
_VISION = {"hidden": 64, "intermediate": 128, "layers": 2, "heads": 4, "image_size": 56}

VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _token_ids() -> dict[str, int]:
    # build_tokenizer gives the extra special tokens the ids right after SPECIAL_TOKENS.
    return {token: len(SPECIAL_TOKENS) + i for i, token in enumerate(VISION_TOKENS)}


def _config(vocab_size: int, max_position_embeddings: int) -> dict[str, object]:
    ids = _token_ids()
    head_dim = _TEXT["hidden"] // _TEXT["heads"]
    return {
        "architectures": ["PaddleOCRVLForConditionalGeneration"],
        "model_type": "paddleocr_vl",
        "torch_dtype": "float32",
        "image_token_id": ids[IMAGE_PAD],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids[VISION_START],
        "vision_end_token_id": ids[VISION_END],
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "paddleocr_vl_text",
            "vocab_size": vocab_size,
            "hidden_size": _TEXT["hidden"],
            "intermediate_size": _TEXT["intermediate"],
            "num_hidden_layers": _TEXT["layers"],
            "num_attention_heads": _TEXT["heads"],
            "num_key_value_heads": _TEXT["kv_heads"],
            "head_dim": head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": max_position_embeddings,
            "rms_norm_eps": 1e-6,
            "use_bias": False,
            # M-RoPE splits the rotary half of each head into temporal, height and width
            # sections (4 + 6 + 6 = 32 / 2).
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [4, 6, 6],
            },
            "bos_token_id": SPECIAL_TOKENS.index("<s>"),
            "eos_token_id": SPECIAL_TOKENS.index("</s>"),
            "pad_token_id": SPECIAL_TOKENS.index("<unk>"),
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "model_type": "paddleocr_vl_vision",
            "hidden_size": _VISION["hidden"],
            "intermediate_size": _VISION["intermediate"],
            "num_hidden_layers": _VISION["layers"],
            "num_attention_heads": _VISION["heads"],
            "num_channels": 3,
            # Position embeddings cover a 4x4 patch grid; larger grids interpolate them.
            "image_size": _VISION["image_size"],
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
        },
    }


def _preprocessor_config() -> dict[str, object]:
    return {
        "image_processor_type": "PaddleOCRVLImageProcessor",
        "processor_class": "PaddleOCRVLProcessor",
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": _IMAGE_MEAN,
        "image_std": _IMAGE_STD,
        "resample": 3,  # bicubic
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": 1,
        "merge_size": MERGE_SIZE,
        "size": {
            "shortest_edge": MIN_IMAGE_TOKENS * _UNIT * _UNIT,
            "longest_edge": MAX_IMAGE_TOKENS * _UNIT * _UNIT,
        },
    }


def _weight_shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint, by its name in published PaddleOCR-VL weights."""
    t, v = _TEXT, _VISION
    head_dim = t["hidden"] // t["heads"]
    kv = head_dim * t["kv_heads"]
    shapes: dict[str, tuple[int, ...]] = {}
    vp = "visual.vision_model."
    shapes[vp + "embeddings.patch_embedding.weight"] = (v["hidden"], 3, PATCH_SIZE, PATCH_SIZE)
    shapes[vp + "embeddings.patch_embedding.bias"] = (v["hidden"],)
    positions = (v["image_size"] // PATCH_SIZE) ** 2
    shapes[vp + "embeddings.position_embedding.weight"] = (positions, v["hidden"])
    for i in range(v["layers"]):
        p = f"{vp}encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            shapes[f"{p}self_attn.{proj}.weight"] = (v["hidden"], v["hidden"])
            shapes[f"{p}self_attn.{proj}.bias"] = (v["hidden"],)
        for norm in ("layer_norm1", "layer_norm2"):
            shapes[f"{p}{norm}.weight"] = (v["hidden"],)
            shapes[f"{p}{norm}.bias"] = (v["hidden"],)
        shapes[f"{p}mlp.fc1.weight"] = (v["intermediate"], v["hidden"])
        shapes[f"{p}mlp.fc1.bias"] = (v["intermediate"],)
        shapes[f"{p}mlp.fc2.weight"] = (v["hidden"], v["intermediate"])
        shapes[f"{p}mlp.fc2.bias"] = (v["hidden"],)
    shapes[vp + "post_layernorm.weight"] = (v["hidden"],)
    shapes[vp + "post_layernorm.bias"] = (v["hidden"],)
    merged = v["hidden"] * MERGE_SIZE * MERGE_SIZE
    shapes["mlp_AR.pre_norm.weight"] = (v["hidden"],)
    shapes["mlp_AR.pre_norm.bias"] = (v["hidden"],)
    shapes["mlp_AR.linear_1.weight"] = (merged, merged)
    shapes["mlp_AR.linear_1.bias"] = (merged,)
    shapes["mlp_AR.linear_2.weight"] = (t["hidden"], merged)
    shapes["mlp_AR.linear_2.bias"] = (t["hidden"],)
    shapes["model.embed_tokens.weight"] = (-1, t["hidden"])  # vocab size filled in
    for i in range(t["layers"]):
        p = f"model.layers.{i}."
        shapes[f"{p}self_attn.q_proj.weight"] = (t["hidden"], t["hidden"])
        shapes[f"{p}self_attn.k_proj.weight"] = (kv, t["hidden"])
        shapes[f"{p}self_attn.v_proj.weight"] = (kv, t["hidden"])
        shapes[f"{p}self_attn.o_proj.weight"] = (t["hidden"], t["hidden"])
        shapes[f"{p}mlp.gate_proj.weight"] = (t["intermediate"], t["hidden"])
        shapes[f"{p}mlp.up_proj.weight"] = (t["intermediate"], t["hidden"])
        shapes[f"{p}mlp.down_proj.weight"] = (t["hidden"], t["intermediate"])
        shapes[f"{p}input_layernorm.weight"] = (t["hidden"],)
        shapes[f"{p}post_attention_layernorm.weight"] = (t["hidden"],)
    shapes["model.norm.weight"] = (t["hidden"],)
    shapes["lm_head.weight"] = (-1, t["hidden"])
    return shapes


def build_tiny_vl_model(
    out_dir: Path, *, seed: int = 0, max_position_embeddings: int = 1024
) -> Path:
    """Write a tiny random PaddleOCR-VL with its tokenizer and image processor config
    into `out_dir`; return the directory."""
    import torch
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = build_tokenizer(
        out_dir,
        extra_special_tokens=VISION_TOKENS,
        named_special_tokens={"image_token": IMAGE_PAD},
        chat_template=VL_CHAT_TEMPLATE,
    )
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, template in _weight_shapes().items():
        shape = tuple(vocab_size if n == -1 else n for n in template)
        module = name.rsplit(".", 2)[-2]
        if "norm" in module and name.endswith(".weight"):
            tensors[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            tensors[name] = torch.zeros(shape)
        else:
            # Wider than the usual 0.02 so the next-token distribution is peaked (as in
            # the text tiny model) and image features are as loud as token embeddings,
            # so an image visibly moves the logits.
            tensors[name] = torch.randn(shape, generator=gen) * 0.2
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "preprocessor_config.json").write_text(
        json.dumps(_preprocessor_config(), indent=2) + "\n"
    )
    # Last, so that a directory with a config.json is a whole model.
    (out_dir / "config.json").write_text(
        json.dumps(_config(vocab_size, max_position_embeddings), indent=2) + "\n"
    )
    return out_dir
