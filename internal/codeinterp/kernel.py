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
import datetime
import fcntl
import functools
import inspect
import io
import json
import math
import numbers
import os
import re
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
    # A figure's plot data (see figure_chart), under the MIME type E2B's
    # kernel uses; the SDK reads it as Result.chart.
    "e2b/chart": "chart",
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


# shown_figures are the figures formatted for display (display(fig), a
# cell's value) since the last flush_figures.
shown_figures = []


def flush_figures():
    """Publish every open matplotlib figure as it is formatted for display
    (PNG unless other formats were chosen, see InlineBackend, and its
    chart), then close them all, as Jupyter's inline backend does at the end
    of a cell and on show(). A figure already shown in the cell and not
    changed since is not sent again."""
    global shown_figures
    shown, shown_figures = shown_figures, []
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or plt.get_backend() != BACKEND:
        return
    try:
        from matplotlib._pylab_helpers import Gcf
        for manager in Gcf.get_all_fig_managers():
            fig = manager.canvas.figure
            if fig.stale or not any(f is fig for f in shown):
                data, _ = shell.display_formatter.format(fig)
                if data:
                    emit_result(data, False)
    except Exception:
        shell.showtraceback()
    finally:
        plt.close("all")


def is_figure(obj):
    module = sys.modules.get("matplotlib.figure")
    return module is not None and isinstance(obj, module.Figure)


# The image formats a figure can be sent in: the names Jupyter's
# InlineBackend.figure_formats and set_matplotlib_formats take, with their
# MIME type and savefig's format. retina (or png2x) is PNG at twice the dpi.
FIGURE_FORMATS = {
    "png": ("image/png", "png"),
    "retina": ("image/png", "png"),
    "png2x": ("image/png", "png"),
    "jpeg": ("image/jpeg", "jpeg"),
    "jpg": ("image/jpeg", "jpeg"),
    "svg": ("image/svg+xml", "svg"),
    "pdf": ("application/pdf", "pdf"),
}


def figure_image(fig, name, kwargs):
    """The figure in the format FIGURE_FORMATS names: at the figure's size
    (figsize x dpi, no tight cropping) unless kwargs say otherwise."""
    options = {"format": FIGURE_FORMATS[name][1], **kwargs}
    if name in ("retina", "png2x"):
        options.setdefault("dpi", fig.dpi * 2)
    buf = io.BytesIO()
    fig.savefig(buf, **options)
    data = buf.getvalue()
    return data.decode("utf-8") if name == "svg" else data


def use_figure_formats(names, kwargs):
    """Makes figures display in the formats named, replacing whatever
    formatted them before (set_matplotlib_formats registers IPython's own)."""
    formatters = shell.display_formatter.formatters
    for mime in {mime for mime, _ in FIGURE_FORMATS.values()}:
        # A printer may be both registered by name and cached by class.
        while formatters[mime].pop("matplotlib.figure.Figure", None) is not None:
            pass
    for name in sorted(names):
        printer = functools.partial(figure_image, name=name, kwargs=dict(kwargs))
        mime = FIGURE_FORMATS[name][0]
        formatters[mime].for_type_by_name("matplotlib.figure", "Figure", printer)


# Charts. E2B's SDK gives a figure's result a chart (Result.chart, typed
# LineChart, ScatterChart, BarChart, PieChart, BoxAndWhiskerChart,
# SuperChart): the plot's data, for clients that draw it themselves. It is
# read from the figure's artists, for the plots code usually makes: lines,
# scatter, bars, a pie, box plots, one chart per axes ("superchart" for a
# figure of several, "unknown" for an axes holding anything else). It never
# costs the result: when reading it fails the chart is left out, and the
# image is sent regardless.

# MAX_CHART_POINTS bounds the points of a figure's lines and scatters: with
# more, the chart is left out (its JSON would dwarf the image, and could
# outgrow the bound on an event line, losing the image too).
MAX_CHART_POINTS = 250_000

# UNIT finds an axis label's unit: "Time (s)", "Temperature [°C]".
UNIT = re.compile(r"\s(?:\(([^()]+)\)|\[([^\[\]]+)\])\s*$")


def chart_number(v):
    """A number for JSON: None for NaN and infinities (JSON has none)."""
    v = float(v)
    return v if math.isfinite(v) else None


def series_label(label, kind, n):
    """An artist's label, or "kind n" for a label matplotlib made up
    ("_child0", "_container1": those legends leave out)."""
    label = "" if label is None else str(label)
    return label if label and not label.startswith("_") else "%s %d" % (kind, n)


def legend_labels(ax, series, kind):
    """The series' labels; when none was given one, those of the axes'
    legend if it has as many entries (plt.legend(["a", "b"]) labels the
    legend, not the artists)."""
    labels = [artist.get_label() for artist in series]
    legend = ax.get_legend()
    if legend is not None and all(not label or str(label).startswith("_") for label in labels):
        texts = [t.get_text() for t in legend.get_texts()]
        if len(texts) == len(series):
            labels = texts
    return [series_label(label, kind, n) for n, label in enumerate(labels, 1)]


class AxisInfo:
    """What a chart says of one axis: its scale, its ticks, and its
    numbers as the data they stand for (dates, category names)."""

    def __init__(self, axis):
        import matplotlib.category as mcategory
        import matplotlib.dates as mdates
        import matplotlib.ticker as mticker
        self.axis = axis
        if hasattr(axis, "get_converter"):
            converter = axis.get_converter()
        else:
            converter = getattr(axis, "converter", None)
        formatter = axis.get_major_formatter()
        # Numbers on the axis are matplotlib's date numbers where its own
        # date formatters read them so (pandas' period axes count periods).
        self.dates = isinstance(formatter, (mdates.DateFormatter, mdates.AutoDateFormatter,
                                            mdates.ConciseDateFormatter))
        date_converters = tuple(getattr(mdates, name, None) or ()
                                for name in ("DateConverter", "_SwitchableDateConverter"))
        self.categories = {}
        if isinstance(converter, mcategory.StrCategoryConverter):
            self.scale = "categorical"
            mapping = getattr(axis.units, "_mapping", None) or {}
            self.categories = {int(n): name for name, n in mapping.items()}
        elif self.dates or isinstance(converter, date_converters):
            self.scale = "datetime"
        else:
            self.scale = axis.get_scale()
        # Ticks labelled by hand (set_xticks(ticks, labels), or
        # set_xticklabels) name what is at them, as categories do.
        self.named_ticks = isinstance(formatter, mticker.FixedFormatter) or (
            isinstance(axis.get_major_locator(), mticker.FixedLocator)
            and isinstance(formatter, mticker.FuncFormatter))

    def value(self, v):
        """A data value of the axis for JSON: dates in ISO 8601, category
        names, numbers."""
        numpy = sys.modules.get("numpy")
        if v is None or numpy is not None and v is numpy.ma.masked:
            return None
        if isinstance(v, str):
            return v
        if isinstance(v, datetime.date):
            return None if v != v else v.isoformat()  # pandas' NaT is no date
        if numpy is not None and isinstance(v, numpy.datetime64):
            v = v.astype("datetime64[us]").item()
            return None if v is None else v.isoformat()
        if isinstance(v, numbers.Number):
            if self.categories and float(v).is_integer() and int(v) in self.categories:
                return self.categories[int(v)]
            if self.dates and math.isfinite(v):
                import matplotlib.dates as mdates
                return mdates.num2date(v).isoformat()
            return chart_number(v)
        return str(v)

    def values(self, seq):
        """value() of each of seq; at once for an array of plain numbers."""
        numpy = sys.modules.get("numpy")
        plain = not self.dates and not self.categories
        if numpy is not None and plain and not numpy.ma.is_masked(seq):
            array = numpy.asarray(seq)
            if array.dtype.kind in "biuf":
                floats = array.astype(float).ravel().tolist()
                return [v if math.isfinite(v) else None for v in floats]
        return [self.value(v) for v in seq]

    def all_ticks(self):
        locs = list(self.axis.get_majorticklocs())
        return locs, [str(label) for label in self.axis.get_major_formatter().format_ticks(locs)]

    def ticks(self):
        """The ticks in view, as values, and their labels."""
        lo, hi = sorted(self.axis.get_view_interval())
        slack = (hi - lo) * 1e-9
        shown = [(loc, label) for loc, label in zip(*self.all_ticks())
                 if lo - slack <= loc <= hi + slack]
        # Tick places are computed: 12 significant digits drop their float
        # noise (1.2000000000000002).
        values = [float("%.12g" % v) if isinstance(v, float) and v else v
                  for v in self.values([loc for loc, _ in shown])]
        return values, [label for _, label in shown]

    def name_at(self, pos):
        """What a bar at pos stands for: its category, the label of the
        nearest tick where ticks are named, else its place's value."""
        if self.categories:
            n = round(pos)
            if abs(pos - n) < 0.5 and n in self.categories:
                return self.categories[n]
        if self.named_ticks:
            locs, labels = self.all_ticks()
            if locs:
                return min(zip(locs, labels), key=lambda tick: abs(tick[0] - pos))[1]
        v = self.value(pos)
        return "" if v is None else v if isinstance(v, str) else "%.6g" % v


def axis_labels(ax, horizontal=False):
    """x_label, y_label, x_unit, y_unit; with horizontal, x is the y axis:
    x names the axis of the categories (bars, boxes), as E2B's charts do."""
    labels = [ax.get_xlabel() or None, ax.get_ylabel() or None]
    if horizontal:
        labels.reverse()
    units = []
    for label in labels:
        match = UNIT.search(label) if label else None
        units.append(match and (match.group(1) or match.group(2)).strip() or None)
    return {"x_label": labels[0], "y_label": labels[1], "x_unit": units[0], "y_unit": units[1]}


def axes_title(ax):
    for loc in ("center", "left", "right"):
        title = ax.get_title(loc)
        if title:
            return title
    return None


def axes_boxplots(ax, present):
    """The box plots drawn on ax (see record_boxplots) whose artists are
    all still there (ax.clear() drops them)."""
    return [record for record in getattr(ax, "_aenv_boxplots", ())
            if all(id(a) in present for a in record["artists"])]


def point_elements(ax, kind, series, x, y):
    """A line or scatter chart's elements: label and points of each series."""
    if kind == "line":
        names = legend_labels(ax, series, "Line")
        data = [(line.get_xdata(orig=True), line.get_ydata(orig=True)) for line in series]
    else:
        names = legend_labels(ax, series, "Series")
        data = [(offsets[:, 0], offsets[:, 1]) for offsets in (c.get_offsets() for c in series)]
    return [{"label": name, "points": [list(p) for p in zip(x.values(xs), y.values(ys))]}
            for name, (xs, ys) in zip(names, data)]


def bar_elements(ax, bars, where):
    """A bar chart's elements: a bar's label names its place on the axis
    where (AxisInfo), its group is its container's (one bar() call)."""
    elements = []
    for group, container in zip(legend_labels(ax, bars, "Group"), bars):
        horizontal = getattr(container, "orientation", None) == "horizontal"
        values = getattr(container, "datavalues", None)
        if values is None:
            values = [p.get_width() if horizontal else p.get_height() for p in container.patches]
        for patch, value in zip(container.patches, values):
            if horizontal:
                pos = patch.get_y() + patch.get_height() / 2
            else:
                pos = patch.get_x() + patch.get_width() / 2
            elements.append({"label": where.name_at(pos), "group": group,
                             "value": chart_number(value)})
    return elements


def box_elements(boxplots):
    return [{"label": box["label"], **{k: chart_number(box[k]) for k in BOX_STATS},
             "outliers": [chart_number(v) for v in box["outliers"]]}
            for record in boxplots for box in record["boxes"]]


def axes_chart(ax):
    """The chart of one axes: its type from what the axes holds."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    present = {id(a) for a in [*ax.lines, *ax.patches, *ax.collections]}
    boxplots = axes_boxplots(ax, present)
    bars = [c for c in ax.containers if isinstance(c, BarContainer) and len(c.patches)]
    taken = {id(a) for record in boxplots for a in record["artists"]}
    for container in bars:
        taken.update(id(a) for a in container.get_children())
        if container.errorbar is not None:
            taken.update(id(a) for a in container.errorbar.get_children())
    lines, scatters, wedges, others = [], [], [], 0
    for line in ax.lines:
        if id(line) in taken or not line.get_visible():
            continue
        # axhline, axvline: reference lines, in axes coordinates on one side.
        if line.get_transform().contains_branch(ax.transData):
            lines.append(line)
    for collection in ax.collections:
        if id(collection) not in taken and collection.get_visible():
            if isinstance(collection, PathCollection):
                scatters.append(collection)
            else:
                others += 1
    for patch in ax.patches:
        if id(patch) not in taken and patch.get_visible():
            if isinstance(patch, Wedge):
                wedges.append(patch)
            else:
                others += 1
    others += sum(1 for image in ax.images if image.get_visible())
    found = {"box_and_whisker": boxplots, "bar": bars, "pie": wedges, "line": lines,
             "scatter": scatters}
    kinds = [kind for kind, artists in found.items() if artists]
    kind = kinds[0] if len(kinds) == 1 and not others else "unknown"

    chart = {"type": kind, "title": axes_title(ax)}
    if kind == "pie":
        # pie computes in float32: angles to a thousandth of a degree.
        chart["elements"] = [{"label": name, "angle": chart_number(round(w.theta2 - w.theta1, 3)),
                              "radius": chart_number(w.r)}
                             for name, w in zip(legend_labels(ax, wedges, "Slice"), wedges)]
    elif kind in ("line", "scatter"):
        chart.update(axis_labels(ax))
        x, y = AxisInfo(ax.xaxis), AxisInfo(ax.yaxis)
        chart["x_ticks"], chart["x_tick_labels"] = x.ticks()
        chart["x_scale"] = x.scale
        chart["y_ticks"], chart["y_tick_labels"] = y.ticks()
        chart["y_scale"] = y.scale
        chart["elements"] = point_elements(ax, kind, found[kind], x, y)
    elif kind == "bar":
        horizontal = getattr(bars[0], "orientation", None) == "horizontal"
        chart.update(axis_labels(ax, horizontal))
        chart["elements"] = bar_elements(ax, bars, AxisInfo(ax.yaxis if horizontal else ax.xaxis))
    elif kind == "box_and_whisker":
        chart.update(axis_labels(ax, boxplots[0]["horizontal"]))
        chart["elements"] = box_elements(boxplots)
    else:
        chart["elements"] = []
    return chart


def figure_chart(fig):
    """The figure's chart (see axes_chart), or None: no axes, or too many
    points."""
    axes = [ax for ax in fig.get_axes() if ax.get_visible() and not hasattr(ax, "_colorbar")]
    if not axes:
        return None
    points = sum(len(line.get_xdata(orig=False)) for ax in axes for line in ax.lines)
    points += sum(len(c.get_offsets()) for ax in axes for c in ax.collections)
    if points > MAX_CHART_POINTS:
        return None
    suptitle = getattr(fig, "_suptitle", None)
    suptitle = (suptitle.get_text() if suptitle is not None else "") or None
    if len(axes) == 1:
        chart = axes_chart(axes[0])
        chart["title"] = chart["title"] or suptitle
        return chart
    return {"type": "superchart", "title": suptitle, "elements": [axes_chart(ax) for ax in axes]}


# BOX_STATS are a box's numbers in a chart, by the names of boxplot's
# statistics (matplotlib.cbook.boxplot_stats): the whiskers' ends are
# min and max.
BOX_STATS = {"min": "whislo", "first_quartile": "q1", "median": "med", "third_quartile": "q3",
             "max": "whishi"}


def record_boxplots(module):
    """Wraps Axes.bxp, which boxplot draws with, so that a box plot's
    statistics stay on its axes: its chart reads them rather than guessing
    them back from lines."""
    bxp = module.Axes.bxp
    signature = inspect.signature(bxp)

    @functools.wraps(bxp)
    def recorded(self, *args, **kwargs):
        artists = bxp(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs).arguments
            stats = list(bound["bxpstats"])
            positions = bound.get("positions")
            if positions is None:
                positions = range(1, len(stats) + 1)
            boxes = [{"label": str(s.get("label", p)), "outliers": list(s.get("fliers", ())),
                      **{k: s[name] for k, name in BOX_STATS.items()}}
                     for s, p in zip(stats, positions)]
            self.__dict__.setdefault("_aenv_boxplots", []).append({
                "boxes": boxes,
                "horizontal": (bound.get("vert", True) is False
                               or bound.get("orientation") == "horizontal"),
                "artists": [a for group in artists.values() for a in group],
            })
        except Exception:
            pass  # no chart of it: its lines read as a line chart
        return artists

    module.Axes.bxp = recorded


def use_backend(module):
    if not os.environ.get("MPLBACKEND"):
        module.use(BACKEND)


class BackendFinder:
    """Makes `aenv_inline` importable as a matplotlib backend, and runs
    POST_IMPORT's hooks on their modules when first imported: that makes
    aenv_inline matplotlib's default (an environment variable would leak
    into the kernel's child processes)."""

    def find_spec(self, name, path=None, target=None):
        import importlib.util
        if name == "aenv_inline":
            return importlib.util.spec_from_loader(name, self)
        if name in POST_IMPORT:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    spec.loader = PostImport(spec.loader, POST_IMPORT[name])
                    return spec
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        module.FigureCanvas = FigureCanvasAgg
        module.show = lambda *args, **kwargs: flush_figures()


class PostImport:
    def __init__(self, loader, hook):
        self.loader = loader
        self.hook = hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.hook(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


POST_IMPORT = {"matplotlib": use_backend, "matplotlib.axes._axes": record_boxplots}

sys.meta_path.insert(0, BackendFinder())

from traitlets import Dict, Set, TraitError, Unicode, default, observe, validate  # noqa: E402
from traitlets.config import Config, Configurable  # noqa: E402
from IPython.core import formatters  # noqa: E402
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


class ChartFormatter(formatters.BaseFormatter):
    """Formats a matplotlib figure's chart (figure_chart); for anything
    else, and when reading the chart fails, it gives nothing. Figures are
    recognised here rather than registered as a type, which
    set_matplotlib_formats would drop with the image formats."""

    format_type = Unicode("e2b/chart")
    _return_type = dict

    def __call__(self, obj):
        if not self.enabled or not is_figure(obj):
            return None
        try:
            return figure_chart(obj)
        except Exception:
            return None


class DisplayFormatter(formatters.DisplayFormatter):
    """IPython's, with ChartFormatter; it notes the figures it formats (see
    flush_figures), and that they are drawn as they are now."""

    @default("formatters")
    def _formatters_default(self):
        d = super()._formatters_default()
        d["e2b/chart"] = ChartFormatter(parent=self)
        return d

    def format(self, obj, include=None, exclude=None):
        data, metadata = super().format(obj, include, exclude)
        if data and is_figure(obj):
            shown_figures.append(obj)
            obj.stale = False  # a later change to it makes it stale again
        return data, metadata


class InlineBackend(Configurable):
    """The figure formats, set as in Jupyter, `%config
    InlineBackend.figure_formats = ['svg']` (or figure_format = 'svg'):
    any of FIGURE_FORMATS, PNG alone by default. print_figure_kwargs go to
    savefig. set_matplotlib_formats (IPython.display's, matplotlib_inline's)
    works too, by IPython's own formatters."""

    figure_formats = Set({"png"}, help="Formats figures are sent in.").tag(config=True)
    figure_format = Unicode(help="One format figures are sent in.").tag(config=True)
    print_figure_kwargs = Dict(help="Arguments of savefig.").tag(config=True)

    @validate("figure_formats")
    def _valid_formats(self, proposal):
        unknown = set(proposal.value) - FIGURE_FORMATS.keys()
        if unknown:
            raise TraitError("unsupported figure formats %s: supported are %s"
                             % (sorted(unknown), sorted(FIGURE_FORMATS)))
        return proposal.value

    @observe("figure_format")
    def _format_changed(self, change):
        if change.new:
            self.figure_formats = {change.new}

    @observe("figure_formats", "print_figure_kwargs")
    def _formats_changed(self, change):
        use_figure_formats(self.figure_formats, self.print_figure_kwargs)


def show_traceback(etype, evalue, stb):
    flush_streams()
    emit({"type": "error", "name": getattr(etype, "__name__", str(etype)),
          "value": str(evalue), "traceback": "\n".join(stb)})


config = Config()
config.HistoryManager.enabled = False
sys.stdout, sys.stderr = stdout, stderr
shell = InteractiveShell.instance(config=config, displayhook_class=Hook,
                                  display_pub_class=Publisher, colors="NoColor")
# The shell's display formatter, replaced by ours where the shell's
# configurables list it (%config finds it there).
shell.configurables.remove(shell.display_formatter)
shell.display_formatter = DisplayFormatter(parent=shell)
shell.configurables.append(shell.display_formatter)
inline_backend = InlineBackend(parent=shell)
shell.configurables.append(inline_backend)
use_figure_formats(inline_backend.figure_formats, inline_backend.print_figure_kwargs)
shell._showtraceback = show_traceback


def enable_matplotlib(gui=None):
    """%matplotlib inline (or no argument), from notebooks: what the kernel
    does anyway, with its own backend. Other backends are matplotlib's, and
    there is no GUI event loop to start (enable_gui)."""
    if gui in (None, "inline", "auto"):
        import matplotlib
        matplotlib.use(BACKEND)
        return "inline", BACKEND
    return InteractiveShell.enable_matplotlib(shell, gui)


shell.enable_matplotlib = enable_matplotlib
shell.enable_gui = lambda gui=None: None
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


def reseed():
    """Seeds the random generators anew: this kernel was restored, in a new
    sandbox, from a template's image that other sandboxes are restored from
    too, and would otherwise draw the very numbers they draw (random,
    numpy's global generator, tempfile's names)."""
    import random
    random.seed()
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        np_random.seed()
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile._name_sequence = None


def execute(request):
    global running
    # The sandbox's env vars, sent when they changed since this kernel
    # last had them (a sandbox restored from a snapshot taken with the
    # kernel running): kept, as those a kernel starts with are.
    os.environ.update(request.get("base_env") or {})
    if request.get("reseed"):
        reseed()
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
