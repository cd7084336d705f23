"""Builders for the tiny local model (and a LoRA adapter for it) that tests and the README
default run on; nothing is downloaded.

The model is a random-weight Llama (2 layers, hidden 128) with a byte-level BPE tokenizer
trained here on a fixed list of the Python standard library's sources, and a ChatML chat
template. The same seed and the same sources give the same files.

torch and transformers come with vLLM; they are imported inside the builders so that
importing this module stays cheap.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path

# ChatML, with tools rendered as Qwen2.5's template does (hermes style): the tools'
# signatures in <tools> in the system turn, an assistant's calls as
# <tool_call>{"name": ..., "arguments": ...}</tool_call>, tool answers as <tool_response>
# in a user turn; so vLLM's `hermes` tool-call parser reads what the model writes.
# Without tools a conversation renders exactly as plain ChatML.
CHAT_TEMPLATE = (
    "{% set ns = namespace(skip_first=false) %}"
    "{% if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] + '\n\n' }}{% set ns.skip_first = true %}"
    "{% endif %}"
    "{{ '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call><|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if loop.first and ns.skip_first %}"
    "{% elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{ '<|im_start|>assistant\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] %}"
    "{% set f = call['function'] %}"
    "{{ '\n<tool_call>\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{{ f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) }}"
    "{{ '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 2048
# Stable, sizeable modules present in every CPython 3.11 install.
_CORPUS_MODULES = [
    "argparse.py",
    "ast.py",
    "base64.py",
    "calendar.py",
    "collections/__init__.py",
    "configparser.py",
    "csv.py",
    "dataclasses.py",
    "datetime.py",
    "decimal.py",
    "difflib.py",
    "email/message.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "inspect.py",
    "json/decoder.py",
    "json/encoder.py",
    "logging/__init__.py",
    "pathlib.py",
    "pickle.py",
    "random.py",
    "shutil.py",
    "statistics.py",
    "string.py",
    "subprocess.py",
    "tarfile.py",
    "textwrap.py",
    "threading.py",
    "typing.py",
    "zipfile.py",
]


def _corpus_files() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [str(stdlib / name) for name in _CORPUS_MODULES if (stdlib / name).is_file()]
    if not files:
        raise RuntimeError(f"no Python sources found under {stdlib} to train a tokenizer on")
    return files


def build_tokenizer(
    out_dir: Path,
    *,
    extra_special_tokens: Sequence[str] = (),
    named_special_tokens: Mapping[str, str] | None = None,
    chat_template: str = CHAT_TEMPLATE,
) -> int:
    """Train the BPE tokenizer, save it with its chat template; return the vocab size.

    `extra_special_tokens` (a vision-language model's markers) take ids right after
    `SPECIAL_TOKENS`, inside the same `VOCAB_SIZE`. `named_special_tokens` become
    attributes of the loaded tokenizer (`{"image_token": ...}` gives `image_token` and
    `image_token_id`, which multimodal processors read)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[*SPECIAL_TOKENS, *extra_special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(_corpus_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>", *extra_special_tokens],
        model_max_length=1024,
        **({"extra_special_tokens": dict(named_special_tokens)} if named_special_tokens else {}),
    )
    fast.chat_template = chat_template
    fast.save_pretrained(str(out_dir))
    return int(tok.get_vocab_size())


# How much the output row of <|im_end|> is scaled in a model that ends its turns: at 3.5 a
# sampled reply (temperature 1) to prompts of 200 to 18k tokens ran 1 to 38 tokens (30 draws).
TURN_END_SCALE = 3.5


def build_tiny_model(
    out_dir: Path, *, seed: int = 0, max_position_embeddings: int = 1024, ends_turns: bool = False
) -> Path:
    """Write a tiny random Llama with its tokenizer into `out_dir`; return the directory.

    The default model never ends a reply on its own but by chance (its end of sequence is
    `</s>`, one token in `VOCAB_SIZE`), which keeps lengths fixed for tests that count
    tokens. `ends_turns` makes one that ends its turns as a chat model does, for clients
    that send no output limit (the agent CLIs): `<|im_end|>` is an end of sequence too
    (in generation_config.json, as Qwen2.5's), and its output row is scaled by
    `TURN_END_SCALE` so that it is sampled often."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = build_tokenizer(out_dir)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        # Wider than the usual 0.02 so the next-token distribution is peaked: greedy
        # decoding then does not hinge on float noise between batch shapes.
        initializer_range=0.2,
        bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index("</s>"),
        pad_token_id=SPECIAL_TOKENS.index("<unk>"),
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if ends_turns:
        turn_end = SPECIAL_TOKENS.index("<|im_end|>")
        model.generation_config.eos_token_id = [config.eos_token_id, turn_end]
        with torch.no_grad():
            model.lm_head.weight[turn_end] *= TURN_END_SCALE
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def build_tiny_lora(
    model_dir: Path, out_dir: Path, *, rank: int = 8, seed: int = 1, scale: float = 0.5
) -> Path:
    """Write a random PEFT-format LoRA adapter on q/v projections of the model in
    `model_dir`. B is non-zero (unlike a fresh PEFT adapter) so outputs change."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text())
    hidden = int(config["hidden_size"])
    head_dim = hidden // int(config["num_attention_heads"])
    kv_out = head_dim * int(config["num_key_value_heads"])
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for proj, out_features in (("q_proj", hidden), ("v_proj", kv_out)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, hidden, generator=gen) * scale
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(out_features, rank, generator=gen) * scale
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": rank * 2,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))
    return out_dir
