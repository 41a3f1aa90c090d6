"""The command line answers bad input with one line naming the file, line or flag (exit 2)."""

import subprocess
import sys
from pathlib import Path


def nerserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nerserve", *args], capture_output=True, text=True, timeout=120)


def test_bad_data_file_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "dev.jsonl").write_text(
        '{"tokens": ["a"], "entities": []}\n{"tokens": ["a"], "entities": [{"type": "X", "spans": [[0, 5]]}]}\n'
    )
    result = nerserve("eval", "span-conll03", "--data", str(tmp_path), "--split", "dev")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path}/dev.jsonl:2: entity 'X': span [0, 5] outside 0..1 or empty"
    assert "Traceback" not in result.stderr


def test_missing_split_unknown_model_and_bad_flag(tmp_path: Path, data_root: Path) -> None:
    missing = nerserve("eval", "span-conll03", "--data", str(tmp_path), "--split", "test")
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: {tmp_path}/test.jsonl: no such data file"
    unknown = nerserve("eval", "no-such-model", "--data", str(data_root / "conll03"), "--limit", "1")
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: unknown model 'no-such-model'")
    assert len(unknown.stderr.strip().splitlines()) == 1
    flag = nerserve("eval", "span-conll03", "--data", str(tmp_path), "--bogus")
    assert flag.returncode == 2 and "No such option: --bogus" in flag.stderr
    assert "Traceback" not in flag.stderr
    bad_split = nerserve("eval", "span-conll03", "--data", str(tmp_path), "--split", "validation")
    assert bad_split.returncode == 2 and "--split" in bad_split.stderr


def test_serve_flags_are_the_settings_each_with_its_environment_variable() -> None:
    """Every service setting is declared once (service/config.py) and is a `serve` flag with its
    NERSERVE_* variable shown, except the API keys, which a command line would show to `ps`."""
    from nerserve.service.config import Settings

    for command in ("serve", "serve-ray"):
        shown = nerserve(command, "--help").stdout
        for name in Settings.model_fields:
            flag, variable = f"--{name.replace('_', '-')}", f"NERSERVE_{name.upper()}"
            if name == "api_keys":
                assert f"{flag} " not in shown
            else:
                assert flag in shown and variable in shown.replace("\n", "").replace(" ", ""), (command, name)
    shown = nerserve("serve", "--help").stdout
    bad = nerserve("serve", "--port", "99999")
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --port: Input should be less than or equal to 65535"
    assert "--no-export-missing" in shown
    # the folders: before any command (every command reads them), or after serve
    root = nerserve("--help").stdout
    assert all(f"--{flag}" in root for flag in ("model-store", "graph-cache", "data-root"))
    missing = nerserve("--model-store", "/nonexistent-store", "serve", "--models", "span-conll03", "--port", "0")
    assert missing.returncode != 0 and "/nonexistent-store" in missing.stderr
