"use strict";
// A small canvas line chart for the dashboard's live figures (ours, no
// library: six charts of a few series each need little).
//
//   const c = new LineChart(figureElement, { format: v => v.toFixed(0) });
//   c.push(unixMs, [{ name: "db", value: 1234 }, { name: "db p50", group: "db", dashed: true, value: 12 }]);
//
// Each push adds one point per series (null: a gap) and keeps the last
// `capacity` points. Series with the same `group` share a colour. The
// figure's legend (<ul class="legend">) lists each series with its latest
// value; every <li> carries data-series, data-value (latest, "" for none),
// data-peak and data-points (the points the canvas shows), and the figure
// data-updates (pushes so far), so a test or a user agent can read what
// the canvas shows. `max` fixes the top of the y axis (100 for a %).
(function (global) {
  const PALETTE = ["#1f6feb", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#0a7ea4", "#bc4c00", "#57606a"];
  const AXIS = "#8c959f";
  const GRID = "#eaeef2";
  const TEXT = "#57606a";

  // The smallest of 1, 2, 2.5, 5 x 10^k at or above v (an axis top).
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) {
      if (m * p >= v) return m * p;
    }
    return 10 * p;
  }

  // An axis label: as many decimals as the step needs, k and M above 10^4.
  function tick(v, step) {
    if (v >= 1e6) return `${(v / 1e6).toFixed(step >= 1e6 ? 0 : 1)}M`;
    if (v >= 1e4) return `${(v / 1e3).toFixed(step >= 1e3 ? 0 : 1)}k`;
    let d = 0;
    while (d < 3 && Math.abs(step * 10 ** d - Math.round(step * 10 ** d)) > 1e-9) d += 1;
    return v.toFixed(d);
  }

  class LineChart {
    constructor(figure, opts) {
      opts = opts || {};
      this.figure = figure;
      this.canvas = figure.querySelector("canvas");
      this.legend = figure.querySelector(".legend");
      this.capacity = opts.capacity || 300;
      this.intervalMs = opts.intervalMs || 1000;
      this.format = opts.format || ((v) => String(Math.round(v)));
      this.emptyText = opts.emptyText || "no data yet";
      // A fixed top of the y axis (percentages: 100), else fitted.
      this.max = opts.max || null;
      this.times = [];
      this.series = new Map();
      this.colors = new Map();
      this.updates = 0;
      if (global.ResizeObserver) {
        new ResizeObserver(() => this.draw()).observe(this.canvas);
      }
    }

    color(group) {
      if (!this.colors.has(group)) {
        this.colors.set(group, PALETTE[this.colors.size % PALETTE.length]);
      }
      return this.colors.get(group);
    }

    push(t, points) {
      this.times.push(t);
      const seen = new Set();
      for (const p of points) {
        let s = this.series.get(p.name);
        if (!s) {
          s = {
            values: new Array(this.times.length - 1).fill(null),
            color: this.color(p.group || p.name),
            dashed: !!p.dashed,
            peak: 0,
          };
          this.series.set(p.name, s);
        }
        const v = Number.isFinite(p.value) ? p.value : null;
        s.values.push(v);
        if (v !== null && v > s.peak) s.peak = v;
        seen.add(p.name);
      }
      for (const [name, s] of this.series) {
        if (!seen.has(name)) s.values.push(null);
      }
      while (this.times.length > this.capacity) {
        this.times.shift();
        for (const s of this.series.values()) s.values.shift();
      }
      for (const [name, s] of this.series) {
        if (!seen.has(name) && s.values.every((v) => v === null)) this.series.delete(name);
      }
      this.updates += 1;
      this.figure.dataset.updates = String(this.updates);
      this.draw();
      this.renderLegend();
    }

    renderLegend() {
      const items = [];
      for (const [name, s] of this.series) {
        const latest = s.values[s.values.length - 1];
        const li = document.createElement("li");
        li.dataset.series = name;
        li.dataset.value = latest === null ? "" : String(latest);
        li.dataset.peak = String(s.peak);
        li.dataset.points = String(s.values.filter((v) => v !== null).length);
        const swatch = document.createElement("span");
        swatch.className = s.dashed ? "swatch dashed" : "swatch";
        swatch.style.borderColor = s.color;
        const label = document.createElement("span");
        label.textContent = name;
        const value = document.createElement("span");
        value.className = "value";
        value.textContent = latest === null ? "–" : this.format(latest);
        li.append(swatch, label, value);
        items.push(li);
      }
      this.legend.replaceChildren(...items);
    }

    draw() {
      const c = this.canvas;
      const ratio = global.devicePixelRatio || 1;
      const w = c.clientWidth;
      const h = c.clientHeight;
      if (w === 0 || h === 0) return;
      if (c.width !== Math.round(w * ratio) || c.height !== Math.round(h * ratio)) {
        c.width = Math.round(w * ratio);
        c.height = Math.round(h * ratio);
      }
      const g = c.getContext("2d");
      g.setTransform(ratio, 0, 0, ratio, 0, 0);
      g.clearRect(0, 0, w, h);
      g.font = "11px system-ui, sans-serif";
      const left = 52, right = 8, top = 8, bottom = 18;
      const pw = w - left - right, ph = h - top - bottom;
      let max = 0;
      for (const s of this.series.values()) {
        for (const v of s.values) if (v !== null && v > max) max = v;
      }
      // Four grid steps of a round size (1, 2, 2.5 or 5 x 10^k).
      const step = this.max ? this.max / 4 : niceCeil(max / 4);
      const yMax = 4 * step;
      // Grid and y labels.
      g.strokeStyle = GRID;
      g.fillStyle = TEXT;
      g.lineWidth = 1;
      g.textAlign = "right";
      g.textBaseline = "middle";
      for (let i = 0; i <= 4; i++) {
        const y = top + ph - (ph * i) / 4;
        g.beginPath();
        g.moveTo(left, Math.round(y) + 0.5);
        g.lineTo(left + pw, Math.round(y) + 0.5);
        g.stroke();
        g.fillText(tick(step * i, step), left - 6, y);
      }
      // Time axis, now on the right: the whole minutes the points cover,
      // from one (a young page's seconds are not a sliver at the edge) up
      // to the last `capacity` intervals.
      const now = this.times.length ? this.times[this.times.length - 1] : Date.now();
      const first = this.times.length ? this.times[0] : now;
      const full = this.capacity * this.intervalMs;
      const span = Math.min(full, Math.max(60000, Math.ceil((now - first) / 60000) * 60000));
      const x = (t) => left + pw - ((now - t) / span) * pw;
      g.textAlign = "center";
      g.textBaseline = "top";
      const every = span <= 60000 ? 15000 : 60000;
      for (let k = 0; k * every <= span; k++) {
        const xx = x(now - k * every);
        const label = k === 0 ? "now" : every < 60000 ? `-${(k * every) / 1000} s` : `-${k} min`;
        g.fillText(label, Math.min(Math.max(xx, left + 14), left + pw - 14), top + ph + 4);
      }
      g.strokeStyle = AXIS;
      g.beginPath();
      g.moveTo(left + 0.5, top);
      g.lineTo(left + 0.5, top + ph + 0.5);
      g.lineTo(left + pw, top + ph + 0.5);
      g.stroke();
      // Nothing to draw (no series, or only gaps): say why instead.
      const drawn = [...this.series.values()].some((s) => s.values.some((v) => v !== null));
      if (!drawn) {
        g.fillStyle = TEXT;
        g.textAlign = "center";
        g.textBaseline = "middle";
        g.fillText(this.emptyText, left + pw / 2, top + ph / 2);
        return;
      }
      // The series: a line per run of values (nulls are gaps), a dot for
      // a run of one point.
      const y = (v) => top + ph - (v / yMax) * ph;
      for (const s of this.series.values()) {
        g.strokeStyle = s.color;
        g.fillStyle = s.color;
        g.lineWidth = 1.75;
        g.setLineDash(s.dashed ? [5, 3] : []);
        for (const run of this.runs(s.values)) {
          g.beginPath();
          if (run.length === 1) {
            g.arc(x(run[0][0]), y(run[0][1]), 2, 0, 2 * Math.PI);
            g.fill();
            continue;
          }
          run.forEach(([t, v], i) => (i === 0 ? g.moveTo(x(t), y(v)) : g.lineTo(x(t), y(v))));
          g.stroke();
        }
      }
      g.setLineDash([]);
    }

    // The runs of non-null values as [time, value] pairs.
    runs(values) {
      const runs = [];
      let run = [];
      values.forEach((v, i) => {
        if (v === null) {
          if (run.length) runs.push(run);
          run = [];
        } else {
          run.push([this.times[i], v]);
        }
      });
      if (run.length) runs.push(run);
      return runs;
    }
  }

  global.LineChart = LineChart;
})(window);
