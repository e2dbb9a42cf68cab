"""horovod.runner.util.threads.in_thread, imported by the suite's common.py."""

import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    def run():
        try:
            target(*args)
        except BaseException:
            if not silent:
                raise
    thread = threading.Thread(target=run, name=name, daemon=daemon)
    thread.start()
    return thread
