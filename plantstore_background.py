"""plantstore's threads (the webhook sender, PostgreSQL's watchdog), by one rule, which
holds under any PEP 3333 server and across a fork:

A thread of plantstore's belongs to the process that started it, and so does all it
uses: a process that finds no state of its own makes it anew (this_process), and never
touches a thread, lock, socket or connection of the process it was forked from.
- It starts when the app is built, so that it works with no request; in a fork's child,
  child_delay seconds after the fork or at its first wake(), so that a child that serves
  nothing and ends soon takes nothing.
- A fork waits on no database. A thread that uses SQLite, whose open files' state a
  child would inherit half-changed, stops before the fork and starts again after, each
  of its waits ending within BACKGROUND_WAIT; one that waits on sockets alone
  (PostgreSQL's) goes on.
- It ends with the process it serves: once every thread left is plantstore's own or a
  daemon (a server has stopped, an embedding program has ended), it finishes what its
  unfinished() says is left, within a bound of its own, then frees what it holds; the
  process's exit (Python's, which joins every thread that is no daemon) waits for it.
"""

import os
import signal
import threading
import time
import weakref

BACKGROUND_WAIT = 1  # seconds a background thread waits on its database, at most
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP}


def this_process(owner, make):
    """owner's state in this process: what make() gave in it, or, if this process has
    none yet (a fork's child), what make() gives now."""
    pid, state = getattr(owner, "_process", (None, None))
    if pid != os.getpid():
        state = make()
        owner._process = os.getpid(), state
    return state


class Background:
    """A thread that runs loop() by the rule above; loop() goes round while
    go_on_after() says so. prepare() makes the process's state before the thread
    starts, so that a fork's child has its own before it serves a request. wake() ends
    a wait early; start() and stop() come in turn."""

    threads = weakref.WeakSet()  # the threads of every Background, alive or not

    def __init__(
        self,
        name,
        loop,
        prepare=lambda: None,
        *,
        stops_for_fork,
        child_delay=0,
        unfinished=lambda: False,
    ):
        self.name, self.loop, self.prepare = name, loop, prepare
        self.unfinished = unfinished
        self.stops_for_fork, self.child_delay = stops_for_fork, child_delay
        self._thread, self.stopping, self._wake = None, False, threading.Event()
        self._resume = False  # whether it ran when a fork came
        # A fork's hooks cannot be taken back: they hold this object weakly, and do
        # nothing once it is gone.
        me = weakref.ref(self)
        os.register_at_fork(
            before=lambda: me() and me()._before_fork(),
            after_in_parent=lambda: me() and me()._after_fork(False),
            after_in_child=lambda: me() and me()._after_fork(True),
        )

    def running(self):
        return bool(self._thread and self._thread.is_alive())

    def start(self, delay=0):
        """Start the thread, its first round `delay` seconds late (or at a wake())."""
        if not self.running():
            self.prepare()  # before the thread, and before a fork's child serves
            self.stopping = self.ending = False
            self._wake = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(delay,), name=self.name
            )
            self.threads.add(self._thread)
            # Signals that stop a server go to another thread, the main one: a
            # server's handler that ends the interpreter there (uWSGI's) would else
            # wait for this thread. The mask is the new thread's, and its threads'.
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                self._thread.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def stop(self, finish=False):
        """End the thread now (a fork's pause), or, with finish, as the process ends."""
        if self.running():
            self.stopping, self.ending = not finish, finish
            self._wake.set()
            self._thread.join()

    def wake(self):
        self._wake.set()

    def go_on_after(self, seconds):
        """Wait up to `seconds`, or until wake(); then whether to go on: not after
        stop(), nor once the process ends. The wait looks for that every second, so
        that no end waits longer for it."""
        until = time.monotonic() + seconds
        while self._serving() and time.monotonic() < until:
            if self._wake.wait(min(1, until - time.monotonic())):
                self._wake.clear()
                break
        return self._serving()

    def _serving(self):
        """Not stopped, and the process it serves goes on (some thread is alive that is
        no daemon and not plantstore's) or, once it ends, has work unfinished()."""
        return not self.stopping and (
            not self.ending
            and any(
                thread.is_alive() and not thread.daemon and thread not in self.threads
                for thread in threading.enumerate()
            )
            or self.unfinished()
        )

    def _run(self, delay):
        if self.go_on_after(delay):
            self.loop()

    def _before_fork(self):
        self._resume = self.running()
        if self.stops_for_fork:
            self.stop()

    def _after_fork(self, child):
        if self._resume and (child or self.stops_for_fork):
            self.start(self.child_delay if child else 0)
