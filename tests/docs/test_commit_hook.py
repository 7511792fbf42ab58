"""The commit-msg hook (.githooks/commit-msg): a subject of at most 72 characters."""
import shutil
import subprocess
from pathlib import Path

import pytest

HOOK = Path(__file__).resolve().parents[2] / ".githooks" / "commit-msg"


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell here")
@pytest.mark.parametrize("subject, ok", [("x" * 72, True), ("x" * 73, False),
                                         ("# a comment first\n" + "y" * 40, True),
                                         ("é" * 72, True)])
def test_the_hook_holds_the_subject_to_72_characters(tmp_path, subject, ok):
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text(subject + "\n\nA body line that is much longer than seventy-two characters "
                                 "is fine, as the body holds the detail.\n", encoding="utf-8")
    result = subprocess.run(["sh", str(HOOK), str(message)], capture_output=True, text=True,
                            env={"LC_ALL": "C.UTF-8", "PATH": "/usr/bin:/bin"})
    assert (result.returncode == 0) == ok, result.stderr
    if not ok:
        assert result.stderr.count("\n") == 1 and "at most 72" in result.stderr
