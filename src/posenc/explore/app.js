// posenc explore: draws the precomputed frames of the page's data block with Plotly.
// Every number shown comes from that block (computed by posenc.functional in Python); this
// script only decodes the arrays, picks the frame of the chosen controls, slices the window of
// position p and hands the arrays to Plotly. It computes no encoding.
(() => {
  "use strict";
  const DATA = JSON.parse(document.getElementById("posenc-explore-data").textContent);
  const VIEWS = JSON.parse(document.getElementById("posenc-explore-views").textContent);
  const META = DATA.meta;
  const P = META.num_positions;
  const CONFIG = { displaylogo: false, responsive: true };

  // --- arrays: {dtype: "f4", shape, bdata} (little-endian float32, base64) -> Float32Array,
  // nested by shape (rows are views into one buffer). Decoded once each.
  const decoded = new WeakMap();
  function split(flat, shape) {
    if (shape.length <= 1) return flat;
    const step = flat.length / shape[0];
    const out = [];
    for (let i = 0; i < shape[0]; i++) {
      out.push(split(flat.subarray(i * step, (i + 1) * step), shape.slice(1)));
    }
    return out;
  }
  function arr(spec) {
    if (!decoded.has(spec)) {
      const bin = atob(spec.bdata);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      decoded.set(spec, split(new Float32Array(bytes.buffer), spec.shape));
    }
    return decoded.get(spec);
  }

  // --- the controls' state, read from and written to the URL fragment
  // (#enc=rope&d=64&scaling=yarn&factor=4&p=40).
  const CHOICES = {
    enc: META.encodings.map((e) => e.id),
    d: META.dims.map(String),
    scaling: META.scalings.map((s) => s.id),
    factor: META.factors.map(String),
  };
  const state = Object.assign({}, META.initial);
  function readHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    for (const key of Object.keys(CHOICES)) {
      if (h.has(key) && CHOICES[key].includes(h.get(key))) state[key] = h.get(key);
    }
    const p = Number(h.get("p"));
    if (h.has("p") && Number.isInteger(p) && p >= 0 && p < P) state.p = p;
  }
  function writeHash() {
    const h = new URLSearchParams({
      enc: state.enc, d: state.d, scaling: state.scaling, factor: state.factor, p: state.p,
    });
    history.replaceState(null, "", "#" + h.toString());
  }

  function frames() {
    const byScaling = DATA.frames[state.enc][state.d];
    const scaling = state.enc === "rope" ? state.scaling : "none";
    const plain = byScaling.none["1"];
    return { f: scaling === "none" ? plain : byScaling[scaling][state.factor], plain, scaling };
  }

  // --- the views: each takes its Python-built template and fills in the frame's arrays.
  function clone(x) { return JSON.parse(JSON.stringify(x)); }
  // A vertical line with its label above the plot (top) or inside at the bottom.
  function vline(x, style, label, top) {
    return {
      shape: { type: "line", xref: "x", yref: "paper", x0: x, x1: x, y0: 0, y1: 1, line: style },
      note: { x, y: top ? 1 : 0, xref: "x", yref: "paper", text: label, showarrow: false,
              yanchor: "bottom", xanchor: top ? "center" : "left", xshift: top ? 0 : 3,
              font: { size: 11, color: style.color }, bgcolor: "rgba(255,255,255,0.85)" },
    };
  }
  // noteY: where the label goes (on a log axis an annotation takes log10 of the value, which
  // the data block holds; a shape takes the value itself).
  function hline(y, style, label, noteY) {
    return {
      shape: { type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: y, y1: y, line: style },
      note: { x: 1, y: noteY === undefined ? y : noteY, xref: "paper", yref: "y", text: label,
              showarrow: false,
              xanchor: "right", yanchor: "bottom", font: { size: 11, color: style.color },
              bgcolor: "rgba(255,255,255,0.85)" },
    };
  }
  function marks(layout, items) {
    layout.shapes = items.map((m) => m.shape);
    layout.annotations = (layout.annotations || []).concat(items.map((m) => m.note));
  }
  const S = META.styles;
  const TEXT = META.text;
  const evalLen = () => META.eval_len[state.factor];

  const DRAW = {
    matrix({ f }) {
      const t = clone(VIEWS.matrix);
      Object.assign(t.data[0], { z: arr(f.matrix), y: META.matrix_positions });
      t.layout.title.text = TEXT[state.enc].matrix_title;
      t.layout.xaxis.title.text = TEXT[state.enc].matrix_x;
      marks(t.layout, [
        hline(state.p, S.p, "p = " + state.p),
        hline(META.train_len, S.train, "train length " + META.train_len),
      ]);
      return t;
    },
    similarity({ f, plain, scaling }) {
      const t = clone(VIEWS.similarity);
      const window = (g) => arr(g.similarity).subarray(P - 1 - state.p, 2 * P - 1 - state.p);
      Object.assign(t.data[0], { x: META.positions, y: window(f), name: f.label });
      Object.assign(t.data[1], { x: META.positions, y: window(plain), visible: scaling !== "none" });
      t.layout.title.text = TEXT[state.enc].similarity_title;
      t.layout.yaxis.title.text = TEXT[state.enc].similarity_y;
      marks(t.layout, [
        vline(state.p, S.p, "p = " + state.p, true),
        vline(META.train_len, S.train, "train " + META.train_len),
        vline(evalLen(), S.eval, "eval " + evalLen()),
      ]);
      return t;
    },
    rotation({ f }) {
      const t = clone(VIEWS.rotation);
      const rot = arr(f.rotation); // [3][2][P]
      for (let k = 0; k < 3; k++) {
        const [x, y] = rot[k];
        Object.assign(t.data[3 * k], { x, y });
        Object.assign(t.data[3 * k + 1], { x: x.subarray(0, state.p + 1), y: y.subarray(0, state.p + 1) });
        Object.assign(t.data[3 * k + 2], { x: [0, x[state.p]], y: [0, y[state.p]], name: f.rotation_names[k] });
      }
      t.layout.title.text = TEXT[state.enc].rotation_title + " — p = " + state.p;
      return t;
    },
    wavelengths({ f, plain, scaling }) {
      const t = clone(VIEWS.wavelengths);
      Object.assign(t.data[0], { y: arr(f.wavelengths), name: f.label });
      Object.assign(t.data[1], { y: arr(plain.wavelengths), visible: scaling !== "none" });
      marks(t.layout, [
        hline(META.train_len, S.train, "train length " + META.train_len, META.log_train_len),
        hline(evalLen(), S.eval, "eval length " + evalLen() + " (train × " + state.factor + ")",
              META.log_eval_len[state.factor]),
      ]);
      return t;
    },
  };

  let drawn = 0;
  function draw() {
    const sel = frames();
    document.getElementById("posenc-explore-call").textContent = sel.f.call;
    for (const el of document.querySelectorAll("[data-rope-only]")) el.disabled = state.enc !== "rope";
    for (const el of document.querySelectorAll("[data-needs-scaling]")) {
      el.classList.toggle("idle", state.enc !== "rope" || state.scaling === "none");
    }
    document.getElementById("p-value").textContent = String(state.p);
    // Each view's caption is the chosen encoding's (a sinusoidal table is not RoPE's).
    for (const [view, text] of Object.entries(META.captions[state.enc])) {
      document.getElementById("caption-" + view).textContent = text;
    }
    const jobs = Object.keys(DRAW).map((view) => {
      const t = DRAW[view](sel);
      return Plotly.react("view-" + view, t.data, t.layout, CONFIG);
    });
    return Promise.all(jobs).then(() => {
      drawn += 1;
      document.body.dataset.drawn = String(drawn);
      document.body.dataset.state = JSON.stringify(state);
    });
  }

  // --- wiring
  const controls = {
    enc: document.getElementById("control-enc"),
    d: document.getElementById("control-d"),
    scaling: document.getElementById("control-scaling"),
    factor: document.getElementById("control-factor"),
    p: document.getElementById("control-p"),
  };
  function showState() {
    for (const [key, el] of Object.entries(controls)) el.value = String(state[key]);
  }
  for (const [key, el] of Object.entries(controls)) {
    el.addEventListener(key === "p" ? "input" : "change", () => {
      state[key] = key === "p" ? Number(el.value) : el.value;
      writeHash();
      draw();
    });
  }
  window.addEventListener("hashchange", () => { readHash(); showState(); draw(); });
  readHash();
  showState();
  draw();
})();
