# The code interpreter's bash kernel: one per bash context. It speaks the
# same JSON lines with the service as kernel.py (fd 3 requests, fd 4 events)
# and runs every cell in one bash process, so that variables, functions and
# the working directory are kept between cells, as in a terminal.
#
# A cell is written to a file of its own and sourced: a syntax error fails
# that cell alone, and the cell cannot read the commands that follow it (bash
# reads its commands from a pipe of its own, its stdin is /dev/null). The
# cell's exit status is the last command's; a non-zero one is reported as an
# error whose value is that status, as Jupyter's bash kernel does. SIGINT
# (the service's interrupt) is passed to bash's process group: the command
# running stops and the rest of the cell is skipped. It is passed again
# every INTERRUPT_AGAIN seconds until the cell ends: one that reached bash
# as it was starting a command (between the fork and the wait) is held by
# bash until that command ends, and the command never saw it. A cell that
# exits bash gets its status reported and the next cell a new bash.
import fcntl
import io
import json
import os
import select
import shlex
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading

EVENTS_FD = 4
REQUESTS_FD = 3
INTERRUPT_AGAIN = 0.25

emit_lock = threading.Lock()


def emit(event):
    data = (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8", "replace")
    with emit_lock:
        view = memoryview(data)
        while view:
            n = os.write(EVENTS_FD, view)
            view = view[n:]


class Output:
    """Sends what bash writes to one of its pipes as that stream's events:
    from a thread while a cell runs, and whatever is left at drain()."""

    def __init__(self, fd, name):
        self.fd, self.name = fd, name
        os.set_blocking(fd, False)
        self.lock = threading.Lock()
        # closing is set by close() or by the thread at the pipe's end:
        # whichever comes second closes the pipe.
        self.closing = False
        threading.Thread(target=self.run, daemon=True).start()

    def read_some(self):
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return True
        if not data:
            return False
        emit({"type": self.name, "text": data.decode("utf-8", "replace")})
        return True

    def run(self):
        while True:
            select.select([self.fd], [], [])
            with self.lock:
                if not self.read_some():
                    if self.closing:
                        os.close(self.fd)
                    else:
                        self.closing = True
                    return

    def drain(self):
        with self.lock:
            while pending(self.fd) > 0 and self.read_some():
                pass

    def close(self):
        """Closes the pipe once its thread has read it to the end (bash and
        what it started have closed it); else the thread keeps it."""
        with self.lock:
            self.closing = True


def pending(fd):
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


class Bash:
    def __init__(self):
        cmd_r, self.cmds = os.pipe()
        self.status, status_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        os.set_inheritable(cmd_r, True)
        os.set_inheritable(status_w, True)
        self.status_fd = status_w
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "/dev/fd/%d" % cmd_r],
            stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
            pass_fds=(cmd_r, status_w))
        for fd in (cmd_r, status_w, out_w, err_w):
            os.close(fd)
        self.outputs = [Output(out_r, "stdout"), Output(err_r, "stderr")]
        self.status_file = os.fdopen(self.status, "rb", buffering=0)
        self.buffer = b""
        # interrupted says the cell running was interrupted: read_status
        # passes the interrupt again until the cell ends.
        self.interrupted = False
        # bash reads its commands through a descriptor of its own (255):
        # the pipe's, which the commands of cells would inherit (and keep
        # open, or read), goes. The status pipe is closed for the cells
        # too (see execute).
        self.send("exec %d<&-; trap : INT\n" % cmd_r)

    def send(self, text):
        data = text.encode("utf-8")
        while data:
            n = os.write(self.cmds, data)
            data = data[n:]

    def interrupt(self):
        """Passes the interrupt to bash and the command it runs: they are
        in this process's group (which the service kills whole), and this
        process ignores the copy it sends itself."""
        self.interrupted = True
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            os.killpg(os.getpgid(0), signal.SIGINT)
        finally:
            signal.signal(signal.SIGINT, old)

    def read_status(self):
        """The cell's exit status, or None if bash is gone."""
        while b"\n" not in self.buffer:
            # A finite wait: the interrupt comes as a signal, and a select
            # it cuts short is resumed with the wait it was given.
            ready, _, _ = select.select([self.status], [], [], INTERRUPT_AGAIN)
            if not ready:
                if self.interrupted:
                    self.interrupt()
                continue
            chunk = self.status_file.read(64)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return int(line)

    def close(self):
        os.close(self.cmds)
        self.status_file.close()
        self.proc.wait()
        for out in self.outputs:
            out.close()


bash = None


def on_interrupt(signum, frame):
    if bash is not None:
        bash.interrupt()


def quote_env(env):
    return " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in env.items() if k.isidentifier())


def execute(request):
    global bash
    if bash is None:
        bash = Bash()
    base = request.get("base_env") or {}
    if base:
        # Kept for the shells started later (after an exit) as well.
        os.environ.update(base)
        bash.send("export %s\n" % quote_env(base))
    if request.get("reseed"):
        # $RANDOM's state came with the image other sandboxes came from.
        bash.send("RANDOM=%d\n" % int.from_bytes(os.urandom(2), "little"))
    env = {k: v for k, v in (request.get("env") or {}).items() if k.isidentifier()}
    fd, path = tempfile.mkstemp(prefix="aenv-cell-", suffix=".sh")
    with os.fdopen(fd, "w") as f:
        f.write(request.get("code", ""))
        f.write("\n")
    # Per-execution variables are set for the cell and then put back.
    save = "".join('__aenv_saved_%s="$(declare -p %s 2>/dev/null)"; ' % (k, k) for k in env)
    restore = "".join('unset %s; eval "$__aenv_saved_%s"; unset __aenv_saved_%s; ' % (k, k, k) for k in env)
    exports = ("export %s; " % quote_env(env)) if env else ""
    fd_status = bash.status_fd
    bash.interrupted = False
    bash.send("%s%strap 'return 130' INT; source %s %d>&-; __aenv_rc=$?; trap : INT; %sprintf '%%d\\n' \"$__aenv_rc\" >&%d\n"
              % (save, exports, shlex.quote(path), fd_status, restore, fd_status))
    try:
        status = bash.read_status()
    finally:
        os.unlink(path)
    for out in bash.outputs:
        out.drain()
    if status is None:
        # The cell ended bash (exit): its status, and a new bash next time.
        code = bash.proc.wait()
        bash.close()
        bash = None
        if code != 0:
            emit({"type": "error", "name": "", "value": str(code), "traceback": ""})
    elif status != 0:
        emit({"type": "error", "name": "", "value": str(status), "traceback": ""})


def main():
    signal.signal(signal.SIGINT, on_interrupt)
    requests = os.fdopen(REQUESTS_FD, "rb", buffering=0)
    reader = io.BufferedReader(requests)
    emit({"type": "ready"})
    count = 0
    while True:
        line = reader.readline()
        if not line:
            return
        count += 1
        try:
            execute(json.loads(line))
        except Exception as e:
            emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": ""})
        emit({"type": "done", "execution_count": count})


main()
