"use strict";
(function () {
  var errors = document.getElementById("errors");
  function fail(msg) {
    document.body.dataset.errors = String(Number(document.body.dataset.errors || 0) + 1);
    errors.textContent += msg + "\n";
  }
  window.addEventListener("error", function (e) { fail("error: " + e.message); });
  var consoleError = console.error;
  console.error = function () {
    fail("console.error: " + Array.prototype.join.call(arguments, " "));
    consoleError.apply(console, arguments);
  };
  try {
    var start = performance.now();
    var D = JSON.parse(document.getElementById("data").textContent);
    var tip = document.getElementById("tip");
    var LEFT = 96, RIGHT = 12, TOP = 24, PLOT = 220, AXIS = 34, LANE = 16, MAX_BANDS = 20;
    var MAX_ROWS = 400, MAX_SEGS = 200;
    var PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
      "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6", "#8cd17d", "#d4a6c8", "#a0cbe8",
      "#ffbe7d", "#f1ce63", "#499894", "#d37295", "#79706e", "#b6992d", "#fabfd2"];
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    // As the page's text writes bytes: three significant digits at most (ties to even, as
    // Rust formats), trailing zeros dropped.
    function num(v, unit) {
      var d = v >= 100 || v === Math.trunc(v) ? 0 : v >= 10 ? 1 : 2, x = v * Math.pow(10, d), f = Math.floor(x);
      var r = x - f > 0.5 || (x - f === 0.5 && f % 2 === 1) ? f + 1 : f;
      var t = (r / Math.pow(10, d)).toFixed(d);
      if (t.indexOf(".") >= 0) t = t.replace(/0+$/, "").replace(/\.$/, "");
      return t + " " + unit;
    }
    function bytes(b) {
      var u = 0;
      while (b >= 1024 && u < units.length - 1) { b /= 1024; u++; }
      return num(b, units[u]);
    }
    function when(x) {
      if (!D.timed) return "event " + Math.round(x);
      x = x - D.start;
      if (x < 1e3) return num(Math.round(x), "µs");
      if (x < 1e6) return num(x / 1e3, "ms");
      if (x < 120e6) return num(x / 1e6, "s");
      return num(x / 60e6, "min");
    }
    function kindStyle(kind) {
      for (var i = 0; i < D.kinds.length; i++) if (D.kinds[i][0] === kind) return D.kinds[i];
      return [kind, kind, kind, "#7f7f7f"];
    }
    var stepEvents = D.steps.map(function (s) { return s[2]; });
    var stepXs = D.steps.map(function (s) { return s[1]; });
    function stepAt(k) {
      var i = upperBound(stepEvents, k) - 1;
      if (i < 0) return "";
      var s = D.steps[i][0];
      var ph = phaseOf(k);
      // With more steps than the page lists, the step is the last listed one at or before.
      return ph && ph.main ? (D.stepsThinned > 1 ? ", step ≈" : ", step ") + s : "";
    }
    function upperBound(arr, v) {
      var lo = 0, hi = arr.length;
      while (lo < hi) { var mid = (lo + hi) >> 1; if (arr[mid] <= v) lo = mid + 1; else hi = mid; }
      return lo;
    }
    function phaseOf(k) {
      for (var i = 0; i < D.phases.length; i++) {
        if (D.phases[i].first <= k && k <= D.phases[i].last) return D.phases[i];
      }
      return null;
    }
    function ownerLabel(o) {
      if (o < 0) return "(no owner)";
      var name = D.owners[o], slot = D.slots[name];
      if (slot && slot.length) return name + " (planner slot: " + slot.join(", then ") + ")";
      if (/^_+shared_\d+$/.test(name)) return name + " (planner slot)";
      return name;
    }
    // Owners drawn as one band: each named one; every unnamed tensor (`tensor#N`) together;
    // and a numbered family of many owners (`batch0/data`, `batch1/data`, ...: FAMILY or more
    // names that differ only in their numbers, planner slots apart) as one band too.
    var FAMILY = 8, families = {};
    function familyOf(name) {
      return /^_+shared_\d+$/.test(name) ? null : name.replace(/\d+/g, "#");
    }
    D.owners.forEach(function (name) {
      var f = familyOf(name);
      if (f !== null) families[f] = (families[f] || 0) + 1;
    });
    function groupOf(o) {
      if (o < 0) return String(o);
      var name = D.owners[o];
      if (/^tensor#\d+$/.test(name)) return "tensor#";
      var f = familyOf(name);
      return f !== null && families[f] >= FAMILY ? "family:" + f : String(o);
    }
    function groupLabel(key) {
      if (key === "tensor#") return "unnamed tensors (tensor#N)";
      if (key.indexOf("family:") === 0) {
        var f = key.slice(7);
        return f + " (" + families[f] + " tensors, # a number)";
      }
      return ownerLabel(Number(key));
    }
    function extraText(e) {
      if (e < 0) return "";
      var obj = D.extras[e], out = [];
      Object.keys(obj).forEach(function (k) {
        var v = obj[k];
        if (Array.isArray(v)) {
          out.push(k + ":");
          v.forEach(function (f) {
            if (f && typeof f === "object" && "name" in f) {
              out.push("  " + f.name + (f.filename ? " (" + f.filename + (f.line != null ? ":" + f.line : "") + ")" : ""));
            } else out.push("  " + (typeof f === "string" ? f : JSON.stringify(f)));
          });
        } else out.push(k + ": " + (typeof v === "string" ? v : JSON.stringify(v)));
      });
      return out.join("\n");
    }

    // ---- the data of each pool, decoded ----
    function decode(p, pi) {
      var b = p.blocks, n = b.id.length, k;
      var ai = new Float64Array(n), fi = new Float64Array(n), ax = new Float64Array(n), fx = new Float64Array(n);
      var a = 0, x = 0;
      for (k = 0; k < n; k++) {
        a += b.ai[k]; x += b.ax[k];
        ai[k] = a; ax[k] = x;
        fi[k] = b.fi[k] < 0 ? Infinity : a + b.fi[k];
        fx[k] = b.fx[k] < 0 ? Infinity : x + b.fx[k];
      }
      p.index = pi; p.n = n; p.ai = ai; p.fi = fi; p.ax = ax; p.fx = fx;
      // Changes (an allocation or a free), in event order.
      var frees = [];
      for (k = 0; k < n; k++) if (fi[k] !== Infinity) frees.push(k);
      frees.sort(function (u, v) { return fi[u] - fi[v]; });
      var m = n + frees.length, chI = new Float64Array(m), chX = new Float64Array(m), chB = new Int32Array(m);
      var i = 0, j = 0, c = 0;
      while (c < m) {
        if (j >= frees.length || (i < n && ai[i] < fi[frees[j]])) { chI[c] = ai[i]; chX[c] = ax[i]; chB[c] = i; i++; }
        else { var f = frees[j++]; chI[c] = fi[f]; chX[c] = fx[f]; chB[c] = ~f; }
        c++;
      }
      p.chI = chI; p.chX = chX; p.chB = chB;
      bands(p);
      var s = p.segs, sm = [];
      s.forEach(function (g, gi) { sm.push([g[2], g[4], g[1], gi]); if (g[3] >= 0) sm.push([g[3], g[5], -g[1], gi]); });
      sm.sort(function (u, v) { return u[0] - v[0]; });
      p.segCh = sm;
    }
    // One band per owner for the largest owners (by their most bytes alive at once), the others
    // together; bands in order of their first allocation (long-lived ones at the bottom).
    function bands(p) {
      var b = p.blocks, live = {}, most = {}, first = {}, k, grp = new Array(p.n);
      for (k = 0; k < p.n; k++) grp[k] = groupOf(b.o[k]);
      for (var c = 0; c < p.chB.length; c++) {
        var blk = p.chB[c], free = blk < 0;
        if (free) blk = ~blk;
        var o = grp[blk];
        if (!(o in first)) first[o] = c;
        live[o] = (live[o] || 0) + (free ? -1 : 1) * b.s[blk];
        if (!free && live[o] > (most[o] || 0)) most[o] = live[o];
      }
      var owners = Object.keys(most);
      owners.sort(function (u, v) { return most[v] - most[u]; });
      var top = owners.slice(0, MAX_BANDS);
      top.sort(function (u, v) { return first[u] - first[v]; });
      p.bands = top.map(function (o, i) {
        return { key: o, name: groupLabel(o), colour: PALETTE[i % PALETTE.length], most: most[o] };
      });
      var bandOf = {};
      top.forEach(function (o, i) { bandOf[o] = i; });
      if (owners.length > top.length) {
        p.bands.push({ key: "", name: (owners.length - top.length) + " other owners", colour: "#bbbbbb", most: 0 });
      }
      p.bandOf = new Int32Array(p.n);
      for (k = 0; k < p.n; k++) p.bandOf[k] = grp[k] in bandOf ? bandOf[grp[k]] : p.bands.length - 1;
      p.lanes = [];
      p.marks.forEach(function (mk) { if (p.lanes.indexOf(mk[0]) < 0) p.lanes.push(mk[0]); });
      p.lanes.sort(function (u, v) { return kindIndex(u) - kindIndex(v); });
    }
    function kindIndex(kind) {
      for (var i = 0; i < D.kinds.length; i++) if (D.kinds[i][0] === kind) return i;
      return D.kinds.length;
    }
    D.pools.forEach(decode);

    // ---- the columns of the view: per pixel, the state at the moment of most bytes ----
    function lowerBound(arr, v) {
      var lo = 0, hi = arr.length;
      while (lo < hi) { var mid = (lo + hi) >> 1; if (arr[mid] < v) lo = mid + 1; else hi = mid; }
      return lo;
    }
    function columns(p, x0, x1, W) {
      var nb = p.bands.length, dx = (x1 - x0) / W;
      var tot = new Float64Array(W), idx = new Float64Array(W), xAt = new Float64Array(W), v = new Float64Array(W * nb);
      var cur = new Float64Array(nb), total = 0, k;
      var c0 = lowerBound(p.chX, x0);
      var e0 = c0 < p.chI.length ? p.chI[c0] : Infinity;
      for (k = 0; k < p.n; k++) {
        if (p.ai[k] < e0 && p.fi[k] >= e0) { cur[p.bandOf[k]] += p.blocks.s[k]; total += p.blocks.s[k]; }
      }
      var last = c0 > 0 ? p.chI[c0 - 1] : -1, lastX = c0 > 0 ? p.chX[c0 - 1] : x0;
      var col = 0;
      function open(c) { tot[c] = total; idx[c] = last; xAt[c] = lastX; v.set(cur, c * nb); }
      open(0);
      for (var ch = c0; ch < p.chI.length && p.chX[ch] <= x1; ch++) {
        var cc = Math.min(W - 1, Math.floor((p.chX[ch] - x0) / dx));
        while (col < cc) { col++; open(col); }
        var blk = p.chB[ch], sgn = 1;
        if (blk < 0) { blk = ~blk; sgn = -1; }
        cur[p.bandOf[blk]] += sgn * p.blocks.s[blk];
        total += sgn * p.blocks.s[blk];
        last = p.chI[ch]; lastX = p.chX[ch];
        if (total > tot[col]) { tot[col] = total; idx[col] = last; xAt[col] = lastX; v.set(cur, col * nb); }
      }
      while (col < W - 1) { col++; open(col); }
      return { W: W, nb: nb, tot: tot, idx: idx, xAt: xAt, v: v, res: reserved(p, x0, dx, W) };
    }
    function reserved(p, x0, dx, W) {
      var res = new Float64Array(W), r = 0, col = 0, s = p.segCh, i = 0;
      while (i < s.length && s[i][1] < x0) { r += s[i][2]; i++; }
      res[0] = r;
      for (; i < s.length; i++) {
        var cc = Math.floor((s[i][1] - x0) / dx);
        if (cc >= W) break;
        while (col < cc) { col++; res[col] = r; }
        r += s[i][2];
        if (r > res[col]) res[col] = r;
      }
      while (col < W - 1) { col++; res[col] = r; }
      return res;
    }

    // ---- the view, shared by every pool ----
    var main = D.phases.filter(function (ph) { return ph.main; })[0];
    var view = { x0: main ? main.from : D.start, x1: main ? main.to : D.end };
    function clampView(x0, x1) {
      var span = Math.max(x1 - x0, 4), whole = Math.max(D.end - D.start, 4);
      if (span > whole) span = whole;
      if (x0 < D.start) x0 = D.start;
      if (x0 + span > D.start + whole) x0 = D.start + whole - span;
      return { x0: x0, x1: x0 + span };
    }
    view = clampView(view.x0, view.x1);
    var canvases = Array.prototype.slice.call(document.querySelectorAll("canvas.chart"));
    function plotWidth(cv) { return Math.max(50, Math.floor(cv.clientWidth - LEFT - RIGHT)); }
    function px(x, W) { return LEFT + (x - view.x0) / (view.x1 - view.x0) * W; }
    function niceStep(range, ticks) {
      if (range <= 0) return 1;
      var raw = range / ticks, p = Math.pow(10, Math.floor(Math.log10(raw)));
      var ms = [1, 2, 5, 10];
      for (var i = 0; i < ms.length; i++) if (ms[i] * p >= raw) return ms[i] * p;
      return 10 * p;
    }
    // A round step of whole units: of the unit `max` reads in, or of the one below when that
    // would cut less than one unit.
    function byteStep(max) {
      var u = 1;
      while (max / u >= 1024 && u < Math.pow(1024, 4)) u *= 1024;
      var step = niceStep(max / u, 5);
      if (step < 1 && u > 1) { u /= 1024; step = niceStep(max / u, 5); }
      return Math.max(1, step * u);
    }
    function drawAll() {
      canvases.forEach(function (cv) { draw(cv, D.pools[Number(cv.dataset.pool)]); });
      document.getElementById("range").textContent = "showing " + when(view.x0) + " to " + when(view.x1);
      document.body.dataset.view = view.x0 + "," + view.x1;
      document.querySelectorAll("button.phase").forEach(function (b) {
        var ph = b.dataset.phase === "all" ? { from: D.start, to: D.end } : D.phases[Number(b.dataset.phase)];
        var on = Math.abs(ph.from - view.x0) < 1 && Math.abs(Math.max(ph.to, ph.from + 4) - view.x1) < 1;
        b.classList.toggle("on", on);
      });
    }
    function draw(cv, p) {
      var W = plotWidth(cv), H = TOP + PLOT + AXIS + LANE * p.lanes.length + 4;
      var dpr = window.devicePixelRatio || 1, cssW = W + LEFT + RIGHT;
      cv.width = Math.round(cssW * dpr); cv.height = Math.round(H * dpr);
      cv.style.height = H + "px";
      var g = cv.getContext("2d");
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.clearRect(0, 0, cssW, H);
      var cols = columns(p, view.x0, view.x1, W);
      p.cols = cols;
      var top = 1;
      for (var c = 0; c < W; c++) top = Math.max(top, cols.tot[c], cols.res[c]);
      p.total.forEach(function (t) { if (t[0] >= view.x0 && t[0] <= view.x1) top = Math.max(top, t[1]); });
      top *= 1.1;
      var py = function (b) { return TOP + PLOT - b / top * PLOT; };
      p.py = py;
      g.font = "11px system-ui, sans-serif";
      phasesBand(g, W);
      var step = byteStep(top / 1.1);
      g.textAlign = "right";
      for (var b = 0; b <= top; b += step) {
        g.strokeStyle = "#e4e4e4"; g.beginPath(); g.moveTo(LEFT, py(b) + 0.5); g.lineTo(LEFT + W, py(b) + 0.5); g.stroke();
        g.fillStyle = "#333"; g.fillText(bytes(b), LEFT - 6, py(b) + 4);
      }
      stack(g, p, cols, py);
      steps(g, W);
      lines(g, p, cols, py, W);
      peakDot(g, p, py, W);
      axis(g, W);
      lanes(g, p, W);
      if (p.sel) {
        var sx = px(p.sel.x, W);
        if (sx >= LEFT && sx <= LEFT + W) {
          g.strokeStyle = "#222"; g.setLineDash([4, 3]); g.beginPath(); g.moveTo(sx, TOP); g.lineTo(sx, TOP + PLOT); g.stroke(); g.setLineDash([]);
        }
      }
    }
    function phasesBand(g, W) {
      D.phases.forEach(function (ph, i) {
        var a = Math.max(LEFT, px(ph.from, W)), b = Math.min(LEFT + W, px(ph.to, W));
        if (b < LEFT || a > LEFT + W) return;
        g.fillStyle = ph.main ? "#eef4fb" : (i % 2 ? "#f6f6f6" : "#fbfbfb");
        g.fillRect(a, TOP, Math.max(1, b - a), PLOT);
        g.fillStyle = "#555"; g.textAlign = "left";
        if (b - a > 60) g.fillText(ph.name, a + 3, 11);
      });
    }
    function stack(g, p, cols, py) {
      for (var c = 0; c < cols.W; c++) {
        var acc = 0;
        for (var k = 0; k < cols.nb; k++) {
          var val = cols.v[c * cols.nb + k];
          if (val <= 0) continue;
          var lo = py(acc);
          acc += val;
          g.fillStyle = p.bands[k].colour;
          g.fillRect(LEFT + c, py(acc), 1, lo - py(acc));
        }
      }
    }
    function steps(g, W) {
      var i = lowerBound(stepXs, view.x0), free = -Infinity;
      g.textAlign = "left";
      for (; i < D.steps.length && D.steps[i][1] <= view.x1; i++) {
        var x = Math.round(px(D.steps[i][1], W)) + 0.5;
        if (x < free) continue;
        var label = (free === -Infinity ? "step " : "") + D.steps[i][0];
        free = x + 7 * label.length + 10;
        g.strokeStyle = "#999"; g.setLineDash([3, 3]);
        g.beginPath(); g.moveTo(x, TOP - 2); g.lineTo(x, TOP + PLOT); g.stroke(); g.setLineDash([]);
        g.fillStyle = "#777"; g.fillText(label, x + 2, TOP - 3);
      }
    }
    function lines(g, p, cols, py, W) {
      if (p.segmentsRecorded) {
        g.strokeStyle = "#e8871e"; g.lineWidth = 2; g.beginPath();
        for (var c = 0; c < W; c++) { if (c === 0) g.moveTo(LEFT, py(cols.res[0])); else g.lineTo(LEFT + c, py(cols.res[c])); }
        g.stroke(); g.lineWidth = 1;
      }
      if (p.elided > 0 && p.total.length) {
        g.strokeStyle = "#222"; g.beginPath();
        var prev = null;
        p.total.forEach(function (t) {
          var x = Math.min(Math.max(px(t[0], W), LEFT), LEFT + W);
          if (prev === null) g.moveTo(x, py(t[1])); else { g.lineTo(x, py(prev)); g.lineTo(x, py(t[1])); }
          prev = t[1];
        });
        g.lineTo(LEFT + W, py(prev)); g.stroke();
      }
    }
    function peakDot(g, p, py, W) {
      if (!(p.peak.at >= 0)) return;
      var x = px(p.peak.x, W);
      if (x < LEFT - 1 || x > LEFT + W + 1) return;
      var y = py(p.peak.bytes);
      g.fillStyle = "#c0392b"; g.beginPath(); g.arc(x, y, 4.5, 0, 2 * Math.PI); g.fill();
      var label = "peak of " + (main ? main.name : "the run") + ": " + bytes(p.peak.bytes) + " at " + when(p.peak.x) + (p.peak.step !== null ? ", step " + p.peak.step : "");
      g.font = "bold 12px system-ui, sans-serif";
      g.textAlign = x > LEFT + W * 0.7 ? "right" : "left";
      g.fillText(label, x + (g.textAlign === "right" ? -8 : 8), Math.max(TOP + 12, y - 6));
      g.font = "11px system-ui, sans-serif";
    }
    function axis(g, W) {
      var base = TOP + PLOT, step = niceStep(view.x1 - view.x0, 10);
      g.strokeStyle = "#666"; g.beginPath(); g.moveTo(LEFT, base + 0.5); g.lineTo(LEFT + W, base + 0.5); g.stroke();
      g.fillStyle = "#333"; g.textAlign = "center";
      var first = Math.ceil((view.x0 - D.start) / step) * step + D.start;
      for (var x = first; x <= view.x1; x += step) {
        var X = Math.round(px(x, W)) + 0.5;
        g.beginPath(); g.moveTo(X, base); g.lineTo(X, base + 5); g.stroke();
        g.fillText(tickLabel(x, step), X, base + 17);
      }
      g.fillStyle = "#555";
      g.fillText(D.timed ? "time since the first event" : "event number (this trace has no times)", LEFT + W / 2, base + 31);
    }
    // A tick of the time axis, with as many decimals as the step needs.
    function tickLabel(x, step) {
      if (!D.timed) return String(Math.round(x));
      var top = view.x1 - D.start, u = top < 1e3 ? [1, "µs"] : top < 1e6 ? [1e3, "ms"] : [1e6, "s"];
      var d = Math.max(0, Math.min(6, Math.ceil(-Math.log10(step / u[0]) - 1e-9)));
      return ((x - D.start) / u[0]).toFixed(d) + " " + u[1];
    }
    function lanes(g, p, W) {
      p.lanes.forEach(function (kind, li) {
        var st = kindStyle(kind), y0 = TOP + PLOT + AXIS + li * LANE, most = 1;
        p.marks.forEach(function (m) { if (m[0] === kind) most = Math.max(most, m[3]); });
        g.fillStyle = "#333"; g.textAlign = "right"; g.fillText(st[2], LEFT - 6, y0 + 11);
        g.fillStyle = st[3];
        p.marks.forEach(function (m) {
          if (m[0] !== kind || m[1] < view.x0 || m[1] > view.x1) return;
          var h = 4 + 8 * Math.min(1, Math.log(Math.max(m[3], 1)) / Math.max(1, Math.log(most)));
          g.fillRect(px(m[1], W) - 1, y0 + 13 - h, 2.5, h);
        });
      });
    }

    // ---- the blocks alive at a moment, and the allocator's state ----
    function aliveAt(p, k) {
      var out = [];
      for (var i = 0; i < p.n; i++) if (p.ai[i] <= k && p.fi[i] > k) out.push(i);
      out.sort(function (u, v) { return p.blocks.s[v] - p.blocks.s[u] || p.blocks.id[u] - p.blocks.id[v]; });
      return out;
    }
    function blockText(p, i) {
      var b = p.blocks, q = b.q[i] || b.s[i];
      var t = ownerLabel(b.o[i]) + ": " + bytes(b.s[i]) + (q !== b.s[i] ? " (" + bytes(q) + " asked for)" : "") +
        ", stream " + b.t[i] + ", allocated at " + when(p.ax[i]) + stepAt(p.ai[i]) +
        ", " + (p.fx[i] === Infinity ? "still alive at the end" : "freed at " + when(p.fx[i]));
      if (b.g[i] >= 0) t += ", segment " + b.g[i] + " at offset " + b.f[i];
      var ex = extraText(b.e[i]);
      return ex ? t + "\n" + ex : t;
    }
    function select(p, k, x) {
      p.sel = { k: k, x: x };
      var panel = document.querySelector("div.state[data-pool=\"" + p.index + "\"]");
      var alive = k >= 0 ? aliveAt(p, k) : [], sum = 0;
      alive.forEach(function (i) { sum += p.blocks.s[i]; });
      var segs = p.segs.filter(function (s) { return s[2] <= k && (s[3] < 0 || s[3] > k); });
      var res = 0;
      segs.forEach(function (s) { res += s[1]; });
      var ph = k >= 0 ? phaseOf(k) : null;
      var h = "<h3>At " + esc(when(x)) + esc(k >= 0 ? stepAt(k) : "") + (ph ? " (" + esc(ph.name) + ")" : "") +
        ", after event " + k + ": " + alive.length + " blocks alive, " + bytes(sum) + " allocated" +
        (p.segmentsRecorded ? ", " + bytes(res) + " reserved in " + segs.length + " segments" : "") + "</h3>";
      if (p.elided > 0) h += "<p class=\"notes\">" + p.elided + " of the smaller blocks of this pool are not listed (see the note above).</p>";
      h += segmentsSvg(p, segs, alive);
      h += "<table class=\"alive\"><thead><tr><th>owner</th><th>size</th><th>asked for</th><th>stream</th>" +
        "<th>segment, offset</th><th>allocated at</th><th>freed at</th><th>more</th></tr></thead><tbody>";
      alive.slice(0, MAX_ROWS).forEach(function (i) {
        var b = p.blocks, q = b.q[i] || b.s[i];
        h += "<tr class=\"block\" data-id=\"" + b.id[i] + "\" data-tip=\"" + esc(blockText(p, i)) + "\"><td class=\"owner\">" +
          esc(ownerLabel(b.o[i])) + "</td><td class=\"num\">" + bytes(b.s[i]) + "</td><td class=\"num\">" + bytes(q) +
          "</td><td class=\"num\">" + b.t[i] + "</td><td>" + (b.g[i] >= 0 ? b.g[i] + ", " + b.f[i] : "-") + "</td><td>" +
          esc(when(p.ax[i]) + stepAt(p.ai[i])) + "</td><td>" + (p.fx[i] === Infinity ? "alive at the end" : esc(when(p.fx[i]))) +
          "</td><td class=\"extra\">" + esc(extraText(b.e[i]).split("\n")[0]) + "</td></tr>";
      });
      if (alive.length > MAX_ROWS) h += "<tr class=\"more\"><td colspan=\"8\">and " + (alive.length - MAX_ROWS) + " more</td></tr>";
      h += "</tbody></table>";
      panel.innerHTML = h;
      panel.dataset.event = String(k);
      panel.dataset.ids = alive.map(function (i) { return p.blocks.id[i]; }).join(",");
      hookTips(panel);
    }
    function esc(s) {
      return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
    }
    // Each segment alive as a bar as wide as its bytes (relative to the largest), its blocks
    // at their offsets in their owners' colours, the free gaps between them in grey.
    function segmentsSvg(p, segs, alive) {
      if (!segs.length) return "";
      var bySeg = {}, most = 1, W = 1000, ROW = 18;
      segs.forEach(function (s) { most = Math.max(most, s[1]); bySeg[s[0]] = []; });
      alive.forEach(function (i) { var g = p.blocks.g[i]; if (g in bySeg) bySeg[g].push(i); });
      var shown = segs.slice(0, MAX_SEGS), h = "<svg class=\"segments\" viewBox=\"0 0 " + (W + 150) + " " + (shown.length * ROW + 4) + "\">";
      shown.forEach(function (s, r) {
        var y = r * ROW + 2, w = Math.max(2, s[1] / most * W), sc = w / s[1];
        h += "<text x=\"146\" y=\"" + (y + 12) + "\" text-anchor=\"end\">segment " + s[0] + ": " + bytes(s[1]) + "</text>";
        h += "<rect class=\"seg\" x=\"150\" y=\"" + y + "\" width=\"" + w.toFixed(1) + "\" height=\"" + (ROW - 4) + "\"/>";
        var blocks = bySeg[s[0]].slice().sort(function (u, v) { return p.blocks.f[u] - p.blocks.f[v]; }), at = 0;
        blocks.forEach(function (i) {
          var off = p.blocks.f[i], sz = p.blocks.s[i];
          if (off > at) h += gap(150 + at * sc, y, (off - at) * sc, off - at, at);
          var band = p.bands[p.bandOf[i]];
          h += "<rect class=\"blk\" data-id=\"" + p.blocks.id[i] + "\" x=\"" + (150 + off * sc).toFixed(1) + "\" y=\"" + y + "\" width=\"" +
            Math.max(0.5, sz * sc).toFixed(1) + "\" height=\"" + (ROW - 4) + "\" fill=\"" + band.colour + "\" data-tip=\"" + esc(blockText(p, i)) + "\"/>";
          at = Math.max(at, off + sz);
        });
        if (at < s[1]) h += gap(150 + at * sc, y, (s[1] - at) * sc, s[1] - at, at);
      });
      if (segs.length > MAX_SEGS) h += "<text x=\"150\" y=\"" + (shown.length * ROW + 2) + "\">and " + (segs.length - MAX_SEGS) + " more segments</text>";
      return h + "</svg>";
    }
    function gap(x, y, w, b, off) {
      return "<rect class=\"gap\" x=\"" + x.toFixed(1) + "\" y=\"" + y + "\" width=\"" + Math.max(0.5, w).toFixed(1) +
        "\" height=\"14\" data-tip=\"free: " + bytes(b) + " at offset " + off + "\"/>";
    }

    // ---- pointer: tooltips, hover, zoom, pan, click ----
    function show(text, ev) {
      tip.textContent = text;
      tip.style.display = "block";
      var x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
      tip.style.left = Math.max(4, x) + "px";
      tip.style.top = (ev.clientY + 16) + "px";
    }
    function hide() { tip.style.display = "none"; }
    function hookTips(root) {
      root.querySelectorAll("[data-tip]").forEach(function (el) {
        el.addEventListener("mousemove", function (ev) { show(el.dataset.tip, ev); });
        el.addEventListener("mouseleave", hide);
      });
    }
    function local(cv, ev) {
      var r = cv.getBoundingClientRect();
      return { x: ev.clientX - r.left, y: ev.clientY - r.top };
    }
    // The text under the pointer at (x, y) of pool p's chart.
    function hoverText(p, x, y) {
      var cols = p.cols, c = Math.floor(x - LEFT);
      if (y > TOP + PLOT + AXIS) return markText(p, x, y);
      if (!cols || c < 0 || c >= cols.W || y < TOP || y > TOP + PLOT) return null;
      var k = cols.idx[c], head = when(cols.xAt[c]) + (k >= 0 ? stepAt(k) : "") + ": ";
      if (k < 0) return head + "nothing allocated yet";
      var acc = 0, band = -1, val = TOP + PLOT - y;
      for (var b = 0; b < cols.nb; b++) {
        var v = cols.v[c * cols.nb + b];
        if (val >= (TOP + PLOT - p.py(acc)) && val < (TOP + PLOT - p.py(acc + v))) { band = b; break; }
        acc += v;
      }
      var t = head + "allocated " + bytes(cols.tot[c]) + (p.segmentsRecorded ? ", reserved " + bytes(cols.res[c]) : "");
      if (band < 0) return t;
      var blocks = aliveAt(p, k).filter(function (i) { return p.bandOf[i] === band; });
      t += "\n" + p.bands[band].name + ": " + bytes(cols.v[c * cols.nb + band]) + " in " + blocks.length + " block(s)";
      blocks.slice(0, 4).forEach(function (i) { t += "\n• " + blockText(p, i).replace(/\n/g, "\n   "); });
      if (blocks.length > 4) t += "\n… and " + (blocks.length - 4) + " more";
      return t;
    }
    function markText(p, x, y) {
      var li = Math.floor((y - TOP - PLOT - AXIS) / LANE), kind = p.lanes[li];
      if (kind === undefined) return null;
      var W = plotWidth(canvases[p.index]), best = null, bd = 4;
      p.marks.forEach(function (m) {
        if (m[0] !== kind) return;
        var d = Math.abs(px(m[1], W) - x);
        if (d < bd) { bd = d; best = m; }
      });
      if (!best) return null;
      var name = kindStyle(kind)[1];
      return (best[2] === 1 ? name + ": " + bytes(best[3]) : best[2] + " × " + name + ": " + bytes(best[3]) + " in all") + ", at " + when(best[1]);
    }
    function zoom(f, at) {
      var x = at === undefined ? (view.x0 + view.x1) / 2 : at;
      view = clampView(x - (x - view.x0) * f, x + (view.x1 - x) * f);
      drawAll();
    }
    canvases.forEach(function (cv) {
      var p = D.pools[Number(cv.dataset.pool)], drag = null;
      function xOf(lx) { return view.x0 + (lx - LEFT) / plotWidth(cv) * (view.x1 - view.x0); }
      cv.addEventListener("wheel", function (ev) {
        ev.preventDefault();
        zoom(ev.deltaY < 0 ? 0.8 : 1.25, xOf(local(cv, ev).x));
      }, { passive: false });
      cv.addEventListener("mousedown", function (ev) { drag = { x: local(cv, ev).x, v: view, moved: false }; });
      window.addEventListener("mouseup", function (ev) {
        if (!drag) return;
        var d = drag; drag = null;
        if (d.moved || ev.target !== cv) return;
        var l = local(cv, ev), c = Math.floor(l.x - LEFT);
        if (!p.cols || c < 0 || c >= p.cols.W) return;
        // A click on the peak's column selects the peak itself.
        if (p.peak.at >= 0 && Math.floor(px(p.peak.x, plotWidth(cv)) - LEFT) === c) select(p, p.peak.at, p.peak.x);
        else select(p, p.cols.idx[c], p.cols.xAt[c]);
        draw(cv, p);
      });
      cv.addEventListener("mousemove", function (ev) {
        var l = local(cv, ev);
        if (drag && (ev.buttons & 1)) {
          var dx = (l.x - drag.x) / plotWidth(cv) * (drag.v.x1 - drag.v.x0);
          if (Math.abs(l.x - drag.x) > 3) drag.moved = true;
          if (drag.moved) { view = clampView(drag.v.x0 - dx, drag.v.x1 - dx); drawAll(); }
          return;
        }
        var t = hoverText(p, l.x, l.y);
        if (t) show(t, ev); else hide();
      });
      cv.addEventListener("mouseleave", hide);
    });
    document.getElementById("zoom-in").addEventListener("click", function () { zoom(0.5); });
    document.getElementById("zoom-out").addEventListener("click", function () { zoom(2); });
    document.getElementById("to-peak").addEventListener("click", function () { toPeaks(); drawAll(); });
    document.querySelectorAll("button.phase").forEach(function (b) {
      b.addEventListener("click", function () {
        var ph = b.dataset.phase === "all" ? { from: D.start, to: D.end } : D.phases[Number(b.dataset.phase)];
        view = clampView(ph.from, ph.to);
        drawAll();
      });
    });
    function toPeaks() {
      D.pools.forEach(function (p) { if (p.peak.at >= 0) select(p, p.peak.at, p.peak.x); });
    }
    function ownersLegend(p) {
      var el = document.querySelector("div.owners[data-pool=\"" + p.index + "\"]"), h = "";
      p.bands.forEach(function (b) {
        h += "<span data-tip=\"" + esc(b.name + (b.most ? ": at most " + bytes(b.most) + " alive at once" : "")) + "\"><i class=\"sw\" style=\"background:" + b.colour + "\"></i>" + esc(b.name) + "</span>";
      });
      el.innerHTML = h;
      hookTips(el);
    }
    D.pools.forEach(ownersLegend);
    var resizeTimer = null;
    window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(drawAll, 100); });
    // For scripts driving the page (its browser test): the view, positions, and the selection.
    window.syncmemPage = {
      view: function () { return [view.x0, view.x1]; },
      setView: function (x0, x1) { view = clampView(x0, x1); drawAll(); },
      clientX: function (pool, x) {
        var cv = canvases[pool];
        return cv.getBoundingClientRect().left + px(x, plotWidth(cv));
      },
      clientY: function (pool, b) { return canvases[pool].getBoundingClientRect().top + D.pools[pool].py(b); },
      peak: function (pool) { return D.pools[pool].peak; },
      columns: function (pool) { return D.pools[pool].cols; }
    };
    toPeaks();
    drawAll();
    document.body.dataset.renderMs = (performance.now() - start).toFixed(1);
    // Since the page was asked for: the whole document parsed, and this script run.
    document.body.dataset.loadedMs = performance.now().toFixed(1);
  } catch (e) {
    fail("error: " + e + (e && e.stack ? "\n" + e.stack : ""));
  }
  document.body.dataset.ready = "1";
})();
