"""SIGTERM stops the CLI as Ctrl-C does, and a SIGTERM repeated while the process exits prints
nothing."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from plugrl_tools.cli import _ignore_sigterm_while_exiting, _stop_on_sigterm


def test_every_sigterm_before_the_exit_interrupts():
    before = signal.getsignal(signal.SIGTERM)
    try:
        _stop_on_sigterm()
        for _ in range(2):  # the second still counts: the first may land where it is swallowed
            with pytest.raises(KeyboardInterrupt, match="signal 15"):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the signal arrives before this ends
    finally:
        signal.signal(signal.SIGTERM, before)
        atexit.unregister(_ignore_sigterm_while_exiting)


def test_a_sigterm_during_the_exit_handlers_is_ignored():
    # a library's exit handler, registered before the run is interrupted, during which a
    # second SIGTERM arrives (a job runner signalling the process group, a second kill)
    program = textwrap.dedent(
        """
        import atexit, os, signal, time

        def library_exit_handler():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)
            print("exit handler finished")

        atexit.register(library_exit_handler)

        from plugrl_tools.cli import _stop_on_sigterm

        _stop_on_sigterm()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt as interruption:
            print("interrupted by", interruption)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert result.stderr == ""  # no "Exception ignored in atexit callback" traceback
    assert result.stdout.splitlines() == ["interrupted by signal 15", "exit handler finished"]
    assert result.returncode == 0
