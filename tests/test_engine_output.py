"""The CLI's quiet mode: the engine's output (Python or C, this process or a child) goes to a log file."""

import os
import subprocess

from agent_gravity._cli import _engine_output


def test_engine_output_goes_to_the_log_and_progress_to_the_terminal(tmp_path, capfd):
    log = tmp_path / "logs" / "engine.log"
    with _engine_output(log) as terminal:
        os.write(1, b"engine stdout\n")
        os.write(2, b"engine stderr\n")
        subprocess.run(["sh", "-c", "echo from a child >&2"], check=True)
        with open(2, "w", closefd=False) as stderr:  # what sys.stderr is outside pytest's capture
            print("a python warning", file=stderr, flush=True)
        terminal.write("progress\n")
        terminal.flush()
    print("the table", flush=True)
    out, err = capfd.readouterr()
    assert all(line in log.read_text() for line in ("engine stdout", "engine stderr", "from a child",
                                                    "a python warning"))
    assert out == "the table\n" and err == "progress\n"


def test_without_a_log_engine_output_goes_to_stderr_and_stdout_stays_clean(capfd):
    with _engine_output(None) as terminal:
        print("engine chatter", flush=True)
        terminal.write("progress\n")
    out, err = capfd.readouterr()
    assert out == "" and "engine chatter" in err and "progress" in err
