// Draws a show_timeline result (tools/show_timeline.py) as SVG: per device a row of steps, one row per lane and a
// row of idle gaps. Zoom (wheel, drag, buttons) re-buckets the embedded columns for the visible window: each pixel
// column shows the mean busy share of the data columns under it; the longest kernels and gaps are drawn exactly.
"use strict";
const NsTimeline = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const LABEL = 110, PLOT = 1000, ROW = 18, GAP = 4, AXIS = 20;  // px in viewBox units
  const MAX_ZOOM_COLUMNS = 2;  // narrowest view: this many data columns across the plot
  const LEVELS = 9;

  function el(name, attrs, parent, text) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function ms(ns) { return (ns / 1e6).toFixed(3) + " ms"; }

  // Mean busy share (0-1) of the data columns covering [f0, f1) in column units, per pixel column.
  function rebucket(levels, f0, f1, pixels) {
    const out = new Float64Array(pixels), step = (f1 - f0) / pixels;
    for (let p = 0; p < pixels; p++) {
      const a = f0 + p * step, b = a + step;
      let sum = 0;
      for (let c = Math.max(0, Math.floor(a)); c < Math.min(levels.length, Math.ceil(b)); c++) {
        const level = levels.charCodeAt(c) - 48;
        if (level > 0 && level <= LEVELS) sum += (level / LEVELS) * (Math.min(b, c + 1) - Math.max(a, c));
      }
      out[p] = sum / step;
    }
    return out;
  }

  function tx(view, t) { return LABEL + ((t - view.start) / (view.end - view.start)) * PLOT; }

  function spans(group, view, items, y, h, cls, title) {
    for (const it of items) {
      if (it.end_ns <= view.start || it.start_ns >= view.end) continue;
      const x0 = Math.max(LABEL, tx(view, it.start_ns)), x1 = Math.min(LABEL + PLOT, tx(view, it.end_ns));
      const r = el("rect", {class: cls, x: x0, y: y, width: Math.max(0.5, x1 - x0), height: h}, group);
      el("title", {}, r, title(it));
    }
  }

  function lane(svg, data, dev, row, view, y) {
    const g = el("g", {class: "lane", "data-device": dev.device, "data-lane": row.lane}, svg);
    el("text", {x: 4, y: y + ROW - 5, class: "label"}, g, row.lane + " " + row.busy_pct.toFixed(1) + "%");
    const s = data.scope, width = s.end_ns - s.start_ns, cols = data.buckets;  // a cut lane draws what it kept
    const shares = rebucket(row.levels, (view.start - s.start_ns) / width * cols,
                            (view.end - s.start_ns) / width * cols, PLOT);
    let p = 0;
    while (p < PLOT) {  // one rect per run of pixel columns with the same shade
      const level = Math.ceil(shares[p] * LEVELS - 1e-9);
      let q = p + 1;
      while (q < PLOT && Math.ceil(shares[q] * LEVELS - 1e-9) === level) q++;
      if (level > 0) {
        const h = (ROW - 2) * level / LEVELS;
        el("rect", {class: "busy " + row.lane, x: LABEL + p, y: y + ROW - 1 - h, width: q - p, height: h}, g);
      }
      p = q;
    }
    const longest = data.kernels.filter(k => k.device === dev.device && k.lane === row.lane);
    spans(g, view, longest, y + 1, ROW - 2, "kernel", k => k.name + ": " + ms(k.duration_ns));
  }

  function device(data, dev, view) {
    const lanes = data.lanes.filter(row => row.device === dev.device);
    const rows = lanes.length + 2;
    const height = AXIS + rows * (ROW + GAP);
    const svg = el("svg", {class: "timeline", viewBox: `0 0 ${LABEL + PLOT + 10} ${height}`,
                           "data-device": dev.device}, null);
    let y = AXIS;
    el("text", {x: 4, y: y + ROW - 5, class: "label"}, svg, "steps");
    spans(el("g", {class: "steps"}, svg), view, data.steps, y + 2, ROW - 4, "step", st => "step " + st.index + ": " +
          ms(st.end_ns - st.start_ns));
    y += ROW + GAP;
    for (const row of lanes) { lane(svg, data, dev, row, view, y); y += ROW + GAP; }
    const gaps = el("g", {class: "gaps"}, svg);
    el("text", {x: 4, y: y + ROW - 5, class: "label"}, gaps, "idle gaps");
    spans(gaps, view, data.gaps.filter(g => g.device === dev.device), y + 1, ROW - 2, "gap",
          g => ms(g.duration_ns) + " idle: " + g.cause + (g.blocked_in ? " in " + g.blocked_in : ""));
    for (let i = 0; i <= 4; i++) {  // axis: ms from the start of the data's window
      const t = view.start + (view.end - view.start) * i / 4;
      el("text", {x: tx(view, t), y: 12, class: "tick", "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle"},
         svg, ((t - data.scope.start_ns) / 1e6).toFixed(3) + " ms");
    }
    return svg;
  }

  function draw(root, data) {
    const full = {start: data.scope.start_ns, end: data.scope.end_ns};
    const minSpan = (full.end - full.start) * MAX_ZOOM_COLUMNS / Math.max(1, data.buckets);
    let view = {...full};
    root.replaceChildren();
    const bar = document.createElement("div");
    bar.className = "zoombar";
    const note = document.createElement("span");
    const plots = document.createElement("div");
    root.append(bar, plots);

    function render() {
      plots.replaceChildren();
      for (const dev of data.devices) {
        const title = document.createElement("h3");
        title.textContent = `device ${dev.device}: busy ${dev.busy_pct.toFixed(1)}%, idle ${ms(dev.idle_ns)}, ` +
                            `${dev.gap_count} gaps >= 1 ms`;
        plots.append(title, device(data, dev, view));
      }
      note.textContent = ` window ${ms(view.start - full.start)} to ${ms(view.end - full.start)}`;
    }

    function zoom(factor, at) {
      const span = Math.min(full.end - full.start, Math.max(minSpan, (view.end - view.start) * factor));
      const centre = at === undefined ? (view.start + view.end) / 2 : at;
      const frac = (centre - view.start) / (view.end - view.start);
      let start = centre - frac * span;
      start = Math.max(full.start, Math.min(full.end - span, start));
      view = {start: start, end: start + span};
      render();
    }

    for (const [label, act] of [["zoom in", () => zoom(0.5)], ["zoom out", () => zoom(2)],
                                ["reset", () => { view = {...full}; render(); }]]) {
      const b = document.createElement("button");
      b.textContent = label;
      b.addEventListener("click", act);
      bar.append(b);
    }
    bar.append(note);

    function timeAt(evt) {
      const svg = evt.target.closest("svg.timeline");
      const box = svg.getBoundingClientRect(), scale = box.width / (LABEL + PLOT + 10);
      const x = (evt.clientX - box.left) / scale - LABEL;
      return view.start + Math.max(0, Math.min(1, x / PLOT)) * (view.end - view.start);
    }

    plots.addEventListener("wheel", evt => {
      if (!evt.target.closest("svg.timeline")) return;
      evt.preventDefault();
      zoom(evt.deltaY < 0 ? 0.8 : 1.25, timeAt(evt));
    }, {passive: false});
    let dragFrom = null;
    plots.addEventListener("mousedown", evt => { if (evt.target.closest("svg.timeline")) dragFrom = timeAt(evt); });
    window.addEventListener("mouseup", evt => {
      if (dragFrom === null || !evt.target.closest || !evt.target.closest("svg.timeline")) { dragFrom = null; return; }
      const to = timeAt(evt), lo = Math.min(dragFrom, to), hi = Math.max(dragFrom, to);
      dragFrom = null;
      if (hi - lo >= minSpan) { view = {start: lo, end: hi}; render(); }
    });
    render();
  }

  return {draw: draw, rebucket: rebucket};
})();
