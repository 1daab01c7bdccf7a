"""``python -m rocm_yolo.ddp.torchrun LOG ARGS...``: ``torch.distributed.run ARGS...``, reporting into LOG.

The launcher (:mod:`.launcher`) starts the ranks with torch's launcher, as Ultralytics does.
That launcher also talks: a banner when it sets ``OMP_NUM_THREADS``, a warning for every rank
it stops, and, when a rank fails, a Python traceback with a table of the failures. The
launcher of rocm-yolo says what happened in one line of its own, and the ranks say why. So
torch's launcher logs into the run's ``torchrun.log`` instead of the terminal, and its
``ChildFailedError`` becomes exit code 1 (its own exit code on that error), and a stop
(``SignalException``) 128 + the signal. On one machine its store listens on the loopback address only
(:func:`_store_on_loopback`). Everything else is ``torch.distributed.run.main`` unchanged. The ranks' own output
still reaches the terminal.

On more than one machine the rendezvous can fail too, and the launcher decides what that means
(:mod:`.rendezvous`), so this says nothing on the terminal of it, and exits with its own code:
:data:`RENDEZVOUS_TIMEOUT` when the other nodes did not come in time (``RendezvousTimeoutError``),
:data:`RENDEZVOUS_FAILED` for any other failure of the rendezvous or its store (the store went
away with the agent of an old round that hosted it, a closed round; also at the end, when the
agent that hosted the store has exited first: ``DistNetworkError``).

Once every rank of this node ended its training (torch's agent enters its exit barrier), what the agent still
writes to stderr is its teardown's: on the node that did not host the rendezvous' store, c10d's
``recvVector failed`` warning with its C++ frames, as the agent that hosted it has gone first. It goes into LOG
from then on, not to the terminal (:func:`_teardown_into`).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
import socket
import sys

from rocm_yolo import environment, errors
from rocm_yolo.run.atomic import open_append, open_no_link
from rocm_yolo.run.events import PREFIX

RENDEZVOUS_TIMEOUT = 62  # ETIME: the nodes did not all come to the rendezvous within its join timeout
RENDEZVOUS_FAILED = 75  # EX_TEMPFAIL: the rendezvous or its store failed (tried again if no rank ran)


def main(argv: list[str]) -> int:
    log_path, args = argv[0], argv[1:]
    os.environ[environment.TORCHRUN_PID] = str(os.getpid())  # the ranks inherit it: each dies with this process
    try:
        from torch.distributed import DistError, run
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.elastic.rendezvous.api import RendezvousError, RendezvousTimeoutError
    except Exception as e:  # a broken torch: no rank can start, and a restart would not help
        print(f"{PREFIX} environment error: torch.distributed.run cannot start: {errors.one_line(e)}", file=sys.stderr)
        return errors.SETUP

    handler = logging.StreamHandler(open_append(log_path))  # in the node's private folder, never through a link
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    reports = logging.getLogger("torch.distributed")  # run.py's and the elastic agent's loggers are below it
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.startswith("torch.distributed."):
            logger.handlers.clear()  # torch's own terminal handlers (torch._logging)
            logger.propagate = True
    reports.handlers[:] = [handler]
    reports.propagate = False
    _teardown_into(log_path)
    if "--rdzv-backend" not in args:  # one machine: the agent's store listens on 127.0.0.1 only
        _store_on_loopback()
    sys.argv = ["torch.distributed.run", *args]
    try:
        run.main(args)
    except ChildFailedError as e:
        reports.error("%s", e.format_msg())
        return 1
    except SignalException as e:  # stopped by the launcher (SIGTERM): the ranks were stopped first
        reports.warning("stopped: %s", e)
        return 128 + int(e.sigval)
    except (RendezvousError, DistError) as e:
        if "--rdzv-backend" not in args:  # one machine: the port was taken meanwhile, ...: a crash, restarted
            return _failed(reports, e, log_path)
        timeout = isinstance(e, RendezvousTimeoutError)
        reports.exception("the rendezvous timed out" if timeout else "the rendezvous or its store failed")
        return RENDEZVOUS_TIMEOUT if timeout else RENDEZVOUS_FAILED
    except Exception as e:  # the rendezvous failed (the port was taken meanwhile), ...: a crash, restarted
        return _failed(reports, e, log_path)
    return 0


def _teardown_into(log_path: str) -> None:
    """From the moment this node's ranks all ended their training (torch's agent enters its exit barrier), its
    stderr goes into ``log_path``: what the agent writes then is its teardown's (a store the other node's agent took
    with it), harmless, and the ranks, which share that stderr, are gone. Nothing changes where torch has no such
    method."""
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    except Exception:
        return
    barrier = SimpleElasticAgent.__dict__.get("_exit_barrier")
    if barrier is None or getattr(barrier, "__rocm_yolo_patch__", False):
        return

    @functools.wraps(barrier)
    def _exit_barrier(self, *args, **kwargs):
        try:
            sys.stderr.flush()
            fd = open_no_link(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.dup2(fd, 2)
            os.close(fd)
        except OSError:
            pass
        return barrier(self, *args, **kwargs)

    _exit_barrier.__rocm_yolo_patch__ = True
    SimpleElasticAgent._exit_barrier = _exit_barrier


_LISTENING: list[socket.socket] = []  # the stores' sockets, open for the life of this process


def _store_on_loopback() -> None:
    """On one machine torch's launcher (its static rendezvous) makes the ranks' store at ``127.0.0.1:PORT``, and
    ``TCPStore`` listens on every address of the machine whatever host it is given: anyone who reaches the port
    could write into it. Here the store listens on the loopback address it was given: a socket bound there is
    handed to it (``master_listen_fd``). Idempotent; where torch has no such rendezvous, nothing changes."""
    try:
        from torch.distributed.elastic.rendezvous import static_tcp_rendezvous as module
    except Exception:
        return
    store = getattr(module, "TCPStore", None)
    if store is None or getattr(store, "__rocm_yolo_patch__", False):
        return

    def loopback_store(host_name, port, *args, **kwargs):
        master = args[1] if len(args) > 1 else kwargs.get("is_master", False)
        if master and kwargs.get("master_listen_fd") is None and _loopback(host_name):
            listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listening.bind((host_name, port))
            listening.listen(socket.SOMAXCONN)
            _LISTENING.append(listening)
            kwargs["master_listen_fd"] = listening.fileno()
        return store(host_name, port, *args, **kwargs)

    loopback_store.__rocm_yolo_patch__ = True
    module.TCPStore = loopback_store


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _failed(reports: logging.Logger, error: Exception, log_path: str) -> int:
    reports.exception("torch.distributed.run failed", exc_info=error)
    print(f"{PREFIX} torch.distributed.run failed: {errors.one_line(error)} (more in {log_path})", file=sys.stderr)
    return errors.FAILED


if __name__ == "__main__":
    from rocm_yolo.process.lifecycle import exit_uncollected

    exit_uncollected(lambda: main(sys.argv[1:]))
