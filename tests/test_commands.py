"""Every command keeps its flags: the move of the command lines into machinery/commands/ (issue 44) took none away.

tests/cli_flags.json holds what each command's --help offered before the move (53 commands, from `python X.py
--help` and `python X.py SUB --help`); each must still offer every one of them. A command may gain flags.
"""

import contextlib
import importlib
import io
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BEFORE = json.loads((ROOT / "tests" / "cli_flags.json").read_text(encoding="utf-8"))
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def help_text(command: str) -> str:
    """What `python CHAPTER.py [SUB] --help` prints, run in this process through the chapter's command module."""
    script, *sub = command.split()
    # the module the chapter's __main__ stub hands argv to (model_parallel.py shares parallel.py's)
    stub = re.search(
        r"from machinery\.commands import (\w+)", (ROOT / script).read_text(encoding="utf-8")
    )
    assert stub, f"{script} has no __main__ stub handing argv to machinery/commands/"
    module = importlib.import_module(f"machinery.commands.{stub.group(1)}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        module.main([*sub, "--help"])
    assert done.value.code in (0, None), f"{command} --help exited {done.value.code}"
    return out.getvalue()


@pytest.mark.parametrize("command", sorted(BEFORE))
def test_every_command_keeps_every_flag_it_had(command):
    offered = set(FLAG.findall(help_text(command)))
    missing = sorted(set(BEFORE[command]) - offered)
    assert not missing, f"`python {command} --help` no longer offers {', '.join(missing)}"


def test_the_check_sees_a_missing_flag(monkeypatch):
    """A --help that lost a flag fails the check (here: train.py's --resume, removed from its text)."""
    text = help_text("train.py")
    assert "--resume" in text and "--resume" in BEFORE["train.py"]
    assert "--resume" not in set(FLAG.findall(text.replace("--resume", "--re-sume")))
