# The code interpreter's kernel: one per context, started by envd's code
# interpreter service. It runs cells with IPython's InteractiveShell, so that
# results are formatted as in Jupyter (text, HTML, images, ...), and speaks
# JSON lines with the service:
#   fd 3 (read):  {"code": "...", "env": {...}} per execution
#   fd 4 (write): {"type": "ready"} once, then per execution any of
#                 stdout/stderr/result/error and finally {"type": "done"}.
# Output written straight to file descriptors 1 and 2 (child processes, C
# code) goes to pipes of the kernel's own, read by a thread and sent as
# stdout/stderr too, all of it before "done". SIGINT interrupts the running
# cell; the kernel and its state survive.
import base64
import fcntl
import io
import json
import os
import select
import signal
import struct
import sys
import termios
import threading

EVENTS_FD = 4
REQUESTS_FD = 3
BACKEND = "module://aenv_inline"

MIME_KEYS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


emit_lock = threading.Lock()


def emit(event):
    """Write one event line whole: an interrupt is held off while writing,
    and the other thread's lines wait."""
    data = (json.dumps(event, ensure_ascii=False, default=repr) + "\n").encode("utf-8", "replace")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with emit_lock:
            view = memoryview(data)
            while view:
                n = os.write(EVENTS_FD, view)
                view = view[n:]
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class RawOutput:
    """Takes over file descriptor fd with a pipe whose contents go out as
    the stream's events: from a thread while a cell runs (a child process
    that writes much must not block on a full pipe), and whatever is left
    when drain() is called at the cell's end."""

    def __init__(self, fd, name):
        self.name = name
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        os.set_blocking(r, False)
        self.fd = r
        self.lock = threading.Lock()
        threading.Thread(target=self.run, daemon=True).start()

    def pending(self):
        return struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0"))[0]

    def read_some(self):
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        if data:
            emit({"type": self.name, "text": data.decode("utf-8", "replace")})

    def run(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        while True:
            select.select([self.fd], [], [])
            with self.lock:
                self.read_some()

    def drain(self):
        with self.lock:
            while self.pending() > 0:
                self.read_some()


class Stream(io.TextIOBase):
    """sys.stdout/sys.stderr: whole lines go out as they are written, the
    rest on flush (at the latest when the cell ends)."""

    def __init__(self, name, fd):
        super().__init__()
        self.name = name
        self._fd = fd
        self._pending = []

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._fd

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if not s:
            return 0
        self._pending.append(s)
        if "\n" in s:
            text = "".join(self._pending)
            cut = text.rfind("\n") + 1
            self._pending = [text[cut:]] if cut < len(text) else []
            drain_raw()
            emit({"type": self.name, "text": text[:cut]})
        return len(s)

    def flush(self):
        if self._pending:
            text = "".join(self._pending)
            self._pending = []
            drain_raw()
            emit({"type": self.name, "text": text})


stdout = Stream("stdout", 1)
stderr = Stream("stderr", 2)


raw_outputs = []


def drain_raw():
    """Sends what child processes wrote so far, so that it comes before
    what the cell prints next."""
    for raw in raw_outputs:
        raw.drain()


def flush_streams():
    stdout.flush()
    stderr.flush()
    drain_raw()


def emit_result(data, main):
    flush_streams()
    event = {"type": "result", "is_main_result": main}
    for mime, value in data.items():
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode("ascii")
        event[MIME_KEYS.get(mime, mime)] = value
    emit(event)


def flush_figures():
    """Publish every open matplotlib figure as a PNG, then close them all,
    as Jupyter's inline backend does at the end of a cell and on show()."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or plt.get_backend() != BACKEND:
        return
    try:
        from matplotlib._pylab_helpers import Gcf
        for manager in Gcf.get_all_fig_managers():
            fig = manager.canvas.figure
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            emit_result({"text/plain": repr(fig), "image/png": buf.getvalue()}, False)
    except Exception:
        shell.showtraceback()
    finally:
        plt.close("all")


class BackendFinder:
    """Makes `aenv_inline` importable as a matplotlib backend, and makes it
    matplotlib's default when matplotlib is first imported (an environment
    variable would leak into the kernel's child processes)."""

    def find_spec(self, name, path=None, target=None):
        import importlib.util
        if name == "aenv_inline":
            return importlib.util.spec_from_loader(name, self)
        if name == "matplotlib":
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    spec.loader = PostImport(spec.loader)
                    return spec
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        module.FigureCanvas = FigureCanvasAgg
        module.show = lambda *args, **kwargs: flush_figures()


class PostImport:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        if not os.environ.get("MPLBACKEND"):
            module.use(BACKEND)

    def __getattr__(self, name):
        return getattr(self.loader, name)


sys.meta_path.insert(0, BackendFinder())

from traitlets.config import Config  # noqa: E402
from IPython.core.displayhook import DisplayHook  # noqa: E402
from IPython.core.displaypub import DisplayPublisher  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402


class Publisher(DisplayPublisher):
    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
        emit_result(data, False)

    def clear_output(self, wait=False):
        pass


class Hook(DisplayHook):
    def write_output_prompt(self):
        pass

    def write_format_data(self, format_dict, md_dict=None):
        emit_result(format_dict, True)

    def finish_displayhook(self):
        pass


def show_traceback(etype, evalue, stb):
    flush_streams()
    emit({"type": "error", "name": getattr(etype, "__name__", str(etype)),
          "value": str(evalue), "traceback": "\n".join(stb)})


config = Config()
config.HistoryManager.enabled = False
sys.stdout, sys.stderr = stdout, stderr
shell = InteractiveShell.instance(config=config, displayhook_class=Hook,
                                  display_pub_class=Publisher, colors="NoColor")
shell._showtraceback = show_traceback
shell.events.register("post_execute", flush_figures)
sys.stdin = open(os.devnull)
# Taken over only now: until here, what goes wrong (IPython missing, say)
# reaches the service on the process's own stderr.
raw_outputs = [RawOutput(1, "stdout"), RawOutput(2, "stderr")]


# running is true while a cell runs: an interrupt outside one (it came
# after its cell ended) is ignored, and the service sends at most one per
# execution, so the handler disarms itself when it fires.
running = False


def on_interrupt(signum, frame):
    global running
    if running:
        running = False
        raise KeyboardInterrupt


def execute(request):
    global running
    # The sandbox's env vars, sent when they changed since this kernel
    # last had them (a sandbox restored from a snapshot taken with the
    # kernel running): kept, as those a kernel starts with are.
    os.environ.update(request.get("base_env") or {})
    env = request.get("env") or {}
    saved = {k: os.environ.get(k) for k in env}
    count = shell.execution_count
    try:
        os.environ.update(env)
        running = True
        try:
            result = shell.run_cell(request.get("code", ""), store_history=True)
        finally:
            running = False
        count = result.execution_count or count
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        flush_streams()
    return count


def main():
    signal.signal(signal.SIGINT, on_interrupt)
    reader = io.BufferedReader(os.fdopen(REQUESTS_FD, "rb", buffering=0))
    emit({"type": "ready"})
    while True:
        line = reader.readline()
        if not line:
            return
        count = shell.execution_count
        try:
            count = execute(json.loads(line))
        except KeyboardInterrupt:
            pass  # it fired between cell and service, not in the cell
        except Exception as e:
            emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": ""})
        emit({"type": "done", "execution_count": count})


main()
