// Overview: live figures from GET /admin/v1/stats, refreshed every few seconds.

import {admin} from '../api.js';
import {lineChart} from '../charts.js';
import {clear, errorBox, h, table} from '../dom.js';
import {clock, num, seconds} from '../format.js';

const REFRESH_MS = 3000;

function figure(name, label, value, detail) {
  return h('div', {class: 'figure', dataset: {figure: name}},
    h('span', {class: 'label'}, label), h('span', {class: 'value'}, value), detail ? h('span', {class: 'detail'}, detail) : null);
}

function percent(part, whole) {
  return whole > 0 ? `${Math.round((100 * part) / whole)}%` : '—';
}

function errorsText(errors) {
  const entries = Object.entries(errors || {});
  return entries.length ? entries.map(([status, n]) => `${status}: ${num(n)}`).join(', ') : 'none';
}

function render(root, stats) {
  const now = stats.now;
  const win = stats.window;
  const minutes = Math.round(win.seconds / 60);
  const span = win.seconds >= 60 ? `last ${minutes} min` : `last ${Math.round(win.seconds)} s`;
  const figures = h('section', {class: 'figures', 'aria-label': 'Current figures'},
    figure('requests_total', 'Chat requests', num(now.requests_total), 'since start'),
    figure('requests_per_second', 'Requests/s', num(win.requests_per_second), span),
    figure('tokens_total', 'Tokens generated', num(now.completion_tokens_total), `${num(now.prompt_tokens_total)} prompt`),
    figure('tokens_per_second', 'Tokens/s', num(win.completion_tokens_per_second), span),
    figure('queue_depth', 'Queue depth', num(now.queue_depth), 'waiting'),
    figure('running_sequences', 'Running sequences', num(now.running_sequences)),
    figure('kv_cache', 'KV cache use', percent(now.kv_cache_tokens, now.kv_cache_capacity_tokens),
      `${num(now.kv_cache_tokens)} / ${num(now.kv_cache_capacity_tokens)} tokens`),
    figure('ttft', 'Time to first token', `${seconds(win.ttft_seconds.p50)} p50`, `${seconds(win.ttft_seconds.p95)} p95 · ${span}`),
    figure('itl', 'Inter-token latency', `${seconds(win.inter_token_seconds.p50)} p50`, `${seconds(win.inter_token_seconds.p95)} p95 · ${span}`),
    figure('errors', 'Errors', num(Object.values(now.errors_total).reduce((a, b) => a + b, 0)), errorsText(now.errors_total)));

  const series = stats.series;
  const pick = key => series.map(p => [p.at_ms, p[key]]);
  const charts = h('section', {class: 'charts', 'aria-label': 'Last 15 minutes'},
    lineChart({title: 'Requests per second', series: [{label: 'requests/s', points: pick('requests_per_second')}], format: num, xFormat: clock}),
    lineChart({title: 'Tokens per second', series: [
      {label: 'generated', points: pick('completion_tokens_per_second')},
      {label: 'prompt', points: pick('prompt_tokens_per_second')}], format: num, xFormat: clock}),
    lineChart({title: 'Queue and running sequences', series: [
      {label: 'queued', points: pick('queue_depth')},
      {label: 'running', points: pick('running_sequences')}], format: num, xFormat: clock}),
    lineChart({title: 'KV cache use (%)', series: [{label: 'KV cache', points: series.map(p =>
      [p.at_ms, p.kv_cache_capacity_tokens > 0 ? (100 * p.kv_cache_tokens) / p.kv_cache_capacity_tokens : null])}],
    format: v => `${num(v)}%`, xFormat: clock}),
    lineChart({title: 'Time to first token', series: [
      {label: 'p50', points: pick('ttft_p50')}, {label: 'p95', points: pick('ttft_p95')}], format: seconds, xFormat: clock}),
    lineChart({title: 'Inter-token latency', series: [
      {label: 'p50', points: pick('itl_p50')}, {label: 'p95', points: pick('itl_p95')}], format: seconds, xFormat: clock}));

  const errorRows = Object.entries(now.errors_total).map(([status, total]) => ({status, total, recent: win.errors[status] || 0}));
  const errors = h('section', {'aria-label': 'Errors by status'}, h('h2', {}, 'Errors by status'),
    errorRows.length
      ? table([
        {label: 'HTTP status', value: r => r.status},
        {label: 'Since start', value: r => num(r.total), num: true},
        {label: span[0].toUpperCase() + span.slice(1), value: r => num(r.recent), num: true}], errorRows)
      : h('p', {}, 'No error responses since the server started.'));

  clear(root).append(figures, charts, errors);
}

export function mount(main) {
  const updated = h('p', {class: 'muted', role: 'status', id: 'overview-updated'}, 'Loading…');
  const body = h('div', {id: 'overview'});
  const problem = h('div');
  main.append(h('h1', {}, 'Overview'), updated, problem, body);
  let stopped = false;
  let timer;
  async function refresh() {
    try {
      const stats = await admin('/stats');
      if (stopped) return;
      clear(problem);
      render(body, stats);
      updated.textContent = `Updated ${clock(Date.now())}; refreshes every ${REFRESH_MS / 1000} s. Up ${Math.round(stats.uptime_seconds / 60)} min.`;
    } catch (err) {
      if (!stopped) clear(problem).append(errorBox(err));
    }
    if (!stopped) timer = setTimeout(refresh, REFRESH_MS);
  }
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
