// Models: each served model's state, memory and throughput (GET /admin/v1/models and
// /admin/v1/stats); load and unload buttons once several models share the memory budget.

import {admin} from '../api.js';
import {lineChart} from '../charts.js';
import {clear, confirmDialog, errorBox, h, table} from '../dom.js';
import {bytes, clock, num} from '../format.js';

const REFRESH_MS = 5000;

export function mount(main) {
  const problem = h('div');
  const summary = h('p', {class: 'muted', role: 'status'}, 'Loading…');
  const list = h('div', {id: 'models-list'});
  const chart = h('div', {id: 'models-chart', class: 'charts'});
  let stopped = false;
  let timer;

  async function act(work) {
    clear(problem);
    try {
      await work();
    } catch (err) {
      problem.append(errorBox(err));
    }
    await refresh();
  }

  function actions(m, several) {
    if (!several) return h('span', {class: 'muted'}, 'the only model');
    if (m.state === 'loaded') {
      return h('button', {type: 'button', 'aria-label': `Unload ${m.id}`, onclick: () => act(async () => {
        if (m.running_requests > 0 && !(await confirmDialog(`Unload ${m.id}?`,
          `${m.running_requests} requests are running on it; unloading cuts them.`, 'Unload anyway'))) return;
        await admin(`/models/${encodeURIComponent(m.id)}/unload${m.running_requests > 0 ? '?force=true' : ''}`, {method: 'POST'});
      })}, 'Unload');
    }
    return h('button', {type: 'button', 'aria-label': `Load ${m.id}`, onclick: () => act(() =>
      admin(`/models/${encodeURIComponent(m.id)}/load`, {method: 'POST'}))}, 'Load');
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const [models, stats] = await Promise.all([admin('/models'), admin('/stats')]);
      if (stopped) return;
      const live = new Map(stats.models.map(m => [m.id, m]));
      const several = models.data.length > 1;
      const used = models.data.filter(m => m.state === 'loaded').reduce((sum, m) => sum + m.bytes, 0);
      summary.textContent = `${models.data.length} served · loaded models take ${bytes(used)} of the ${bytes(models.budget_bytes)} memory budget (as estimated)`;
      clear(list).append(table([
        {label: 'Model', value: m => h('strong', {}, m.id)},
        {label: 'State', value: m => h('span', {class: `status ${m.state}`}, m.state, m.pinned ? ' (pinned)' : '')},
        {label: 'Memory', value: m => (m.state === 'loaded'
          ? h('span', {}, `${bytes(m.bytes)} estimated`, m.measured_bytes ? [h('br'), `${bytes(m.measured_bytes)} measured`] : null)
          : `${bytes(m.bytes)} when loaded`)},
        {label: 'Running requests', value: m => num(m.running_requests), num: true},
        {label: 'Requests done', value: m => num(live.get(m.id)?.requests_total ?? 0), num: true},
        {label: 'Tokens generated', value: m => num(live.get(m.id)?.completion_tokens_total ?? 0), num: true},
        {label: 'Tokens/s (1 min)', value: m => num(live.get(m.id)?.completion_tokens_per_second_1m ?? 0), num: true},
        {label: 'KV cache', value: m => {
          const l = live.get(m.id);
          return l && l.kv_cache_capacity_tokens ? `${num(l.kv_cache_tokens)} / ${num(l.kv_cache_capacity_tokens)} tokens` : '—';
        }},
        {label: 'Actions', value: m => actions(m, several)},
      ], models.data));
      const series = models.data.map(m => ({label: m.id, points: stats.series.map(p =>
        [p.at_ms, p.completion_tokens_per_second_by_model[m.id] ?? 0])}));
      clear(chart).append(lineChart({title: 'Tokens generated per second, by model (last 15 minutes)', series, format: num, xFormat: clock}));
    } catch (err) {
      if (!stopped) clear(problem).append(errorBox(err));
    }
    if (!stopped) timer = setTimeout(refresh, REFRESH_MS);
  }

  main.append(h('h1', {}, 'Models'), summary, problem, list, chart);
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
