// Charts drawn as SVG: time series lines and stacked daily bars. Series differ by colour and by
// dash or hatch pattern, and every chart has a legend and a text summary, so they read without
// colour; the data is also in a table next to each chart.

import {h} from './dom.js';

const NS = 'http://www.w3.org/2000/svg';
// Chart sizes in SVG units: the SVG scales to its box, so a wide chart gets more units across
// to keep its text the size of the line charts'.
const LINE = {W: 640, H: 220};
const BARS = {W: 1200, H: 300};
const PAD = {left: 56, right: 12, top: 12, bottom: 28};
const COLOURS = ['#1f6fb2', '#c2571a', '#2e8540', '#8a3ab9', '#b8860b', '#5b6770', '#d13c76', '#008b8b'];
const DASHES = ['', '6 3', '2 3', '10 4 2 4', '1 2', '8 2', '4 4 1 4', '12 3'];

function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  for (const c of children.flat()) if (c) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

function niceMax(max) {
  if (!(max > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(max));
  for (const m of [1, 2, 2.5, 5, 10]) if (max <= m * p) return m * p;
  return 10 * p;
}

function yAxis({W, H}, max, format) {
  const ticks = [];
  for (let i = 0; i <= 4; i++) {
    const v = (max * i) / 4;
    const y = PAD.top + (H - PAD.top - PAD.bottom) * (1 - i / 4);
    ticks.push(s('line', {x1: PAD.left, x2: W - PAD.right, y1: y, y2: y, class: 'grid'}));
    ticks.push(s('text', {x: PAD.left - 6, y: y + 4, 'text-anchor': 'end', class: 'tick'}, format(v)));
  }
  return ticks;
}

function legend(items, kind, chartId) {
  return h('ul', {class: 'legend'}, items.map((label, i) => {
    const swatch = s('svg', {width: 28, height: 12, 'aria-hidden': 'true'});
    if (kind === 'line') {
      swatch.append(s('line', {x1: 0, x2: 28, y1: 6, y2: 6, stroke: COLOURS[i % COLOURS.length], 'stroke-width': 3, 'stroke-dasharray': DASHES[i % DASHES.length]}));
    } else {
      swatch.append(s('defs', {}, hatch(`${chartId}-l${i}`, i)));
      swatch.append(s('rect', {x: 0, y: 0, width: 28, height: 12, fill: `url(#${chartId}-l${i})`, stroke: '#222'}));
    }
    return h('li', {}, swatch, ' ', label);
  }));
}

/** A fill of series `i`'s colour with a hatch of its own angle and spacing. */
function hatch(id, i) {
  const colour = COLOURS[i % COLOURS.length];
  const angle = [0, 45, 90, 135, 22, 67, 112, 157][i % 8];
  const gap = 4 + (i % 3) * 2;
  return s('pattern', {id, patternUnits: 'userSpaceOnUse', width: gap, height: gap, patternTransform: `rotate(${angle})`},
    s('rect', {width: gap, height: gap, fill: colour}),
    s('line', {x1: 0, y1: 0, x2: 0, y2: gap, stroke: '#fff', 'stroke-width': 1.5}));
}

let chartCount = 0;

/**
 * Lines over time. `series`: [{label, points: [[ms, value|null]]}]; `format` writes y values.
 * Returns a <figure> whose caption says the latest value of each series.
 */
export function lineChart({title, series, format, xFormat}) {
  const {W, H} = LINE;
  const id = `chart${++chartCount}`;
  const all = series.flatMap(x => x.points);
  const xs = all.map(p => p[0]);
  const ys = all.map(p => p[1]).filter(v => v !== null && v !== undefined);
  const x0 = Math.min(...xs);
  const x1 = Math.max(...xs);
  const max = niceMax(Math.max(0, ...ys));
  const px = t => PAD.left + (W - PAD.left - PAD.right) * (x1 > x0 ? (t - x0) / (x1 - x0) : 0.5);
  const py = v => PAD.top + (H - PAD.top - PAD.bottom) * (1 - v / max);
  const svg = s('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': `${id}-title`, class: 'chart'},
    s('title', {id: `${id}-title`}, title), yAxis(LINE, max, format));
  if (xs.length) {
    const ticks = x1 > x0 ? [[x0, 'start'], [(x0 + x1) / 2, 'middle'], [x1, 'end']] : [[x0, 'middle']];
    for (const [t, anchor] of ticks) {
      svg.append(s('text', {x: px(t), y: H - 8, 'text-anchor': anchor, class: 'tick'}, xFormat(t)));
    }
  }
  series.forEach((line, i) => {
    // A null (no observation in that interval) breaks the line rather than drawing a zero.
    let d = '';
    let pen = 'M';
    for (const [t, v] of line.points) {
      if (v === null || v === undefined) {
        pen = 'M';
        continue;
      }
      d += `${pen}${px(t).toFixed(1)},${py(v).toFixed(1)} `;
      pen = 'L';
    }
    const colour = COLOURS[i % COLOURS.length];
    svg.append(s('path', {d: d || 'M0,0', fill: 'none', stroke: colour, 'stroke-width': 2, 'stroke-dasharray': DASHES[i % DASHES.length]}));
    // Few samples (a server just started) would be a line too short to see: mark each one.
    const known = line.points.filter(p => p[1] !== null && p[1] !== undefined);
    if (known.length <= 30) {
      for (const [t, v] of known) svg.append(s('circle', {cx: px(t), cy: py(v), r: 3, fill: colour}));
    }
  });
  const latest = series.map(line => {
    const last = [...line.points].reverse().find(p => p[1] !== null && p[1] !== undefined);
    return `${line.label}: ${last ? format(last[1]) : 'no data'}`;
  });
  const empty = xs.length === 0 ? h('p', {class: 'muted'}, 'No samples yet (one is taken every few seconds).') : null;
  return h('figure', {class: 'chart-box'}, h('figcaption', {}, h('strong', {}, title), h('span', {class: 'latest'}, latest.join(' · '))),
    svg, empty, legend(series.map(x => x.label), 'line', id));
}

/**
 * Stacked bars per category (days). `stacks`: [{label, values: [number per category]}].
 */
export function stackedBars({title, categories, stacks, format}) {
  const {W, H} = BARS;
  const id = `chart${++chartCount}`;
  const totals = categories.map((_, i) => stacks.reduce((sum, st) => sum + (st.values[i] || 0), 0));
  const max = niceMax(Math.max(0, ...totals));
  const plotW = W - PAD.left - PAD.right;
  const plotH = H - PAD.top - PAD.bottom;
  const slot = categories.length ? plotW / categories.length : plotW;
  const barW = Math.max(2, Math.min(48, slot * 0.7));
  const svg = s('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': `${id}-title`, class: 'chart'},
    s('title', {id: `${id}-title`}, title),
    s('defs', {}, stacks.map((_, i) => hatch(`${id}-p${i}`, i))),
    yAxis(BARS, max, format));
  const labelEvery = Math.ceil(categories.length / 8);
  categories.forEach((cat, ci) => {
    const x = PAD.left + slot * ci + (slot - barW) / 2;
    let y = PAD.top + plotH;
    stacks.forEach((st, si) => {
      const v = st.values[ci] || 0;
      if (v <= 0) return;
      const hgt = (plotH * v) / max;
      y -= hgt;
      svg.append(s('rect', {x, y, width: barW, height: hgt, fill: `url(#${id}-p${si})`, stroke: '#222', 'stroke-width': 0.5},
        s('title', {}, `${cat} · ${st.label}: ${format(v)}`)));
    });
    if (ci % labelEvery === 0) svg.append(s('text', {x: x + barW / 2, y: H - 8, 'text-anchor': 'middle', class: 'tick'}, cat.slice(5)));
  });
  const empty = categories.length === 0 ? h('p', {class: 'muted'}, 'No usage in this range.') : null;
  return h('figure', {class: 'chart-box'}, h('figcaption', {}, h('strong', {}, title)), svg, empty, legend(stacks.map(x => x.label), 'bars', id));
}
