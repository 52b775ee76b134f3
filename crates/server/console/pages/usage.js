// Usage: tokens or cost per UTC day, stacked by key, model, tenant, service tier or batch, from the
// usage report (GET /admin/v1/usage?group_by=day); the table lists the report's rows and the CSV is
// the report's own (the same text `gantry usage --by-day --format csv` prints).

import {admin, query} from '../api.js';
import {stackedBars} from '../charts.js';
import {clear, errorBox, field, h, table} from '../dom.js';
import {isoDay, num, usd} from '../format.js';

const DAY_MS = 86400000;
const STACK_BY = {key_name: 'Key', model: 'Model', tenant: 'Tenant', service_tier: 'Service tier', batch_id: 'Batch'};

function select(name, options, value) {
  return h('select', {name}, options.map(([v, label]) => h('option', {value: v, selected: v === value}, label)));
}

/** Every UTC day from `since` to `until` inclusive, so quiet days show as gaps. */
function days(since, until) {
  const out = [];
  for (let t = Date.parse(`${since}T00:00:00Z`); t <= Date.parse(`${until}T00:00:00Z`) && out.length < 400; t += DAY_MS) {
    out.push(isoDay(new Date(t)));
  }
  return out;
}

export function mount(main) {
  const today = isoDay(new Date());
  const since = h('input', {type: 'date', name: 'since', value: isoDay(new Date(Date.now() - 13 * DAY_MS)), required: true});
  const until = h('input', {type: 'date', name: 'until', value: today, required: true});
  const keySelect = select('key_name', [['', 'All keys']], '');
  const tenant = h('input', {type: 'text', name: 'tenant', placeholder: 'All tenants', autocomplete: 'off'});
  const modelSelect = select('model', [['', 'All models']], '');
  const batch = h('input', {type: 'text', name: 'batch_id', placeholder: 'All batches', autocomplete: 'off'});
  const stackBy = select('stack_by', Object.entries(STACK_BY), 'key_name');
  const measure = select('measure', [['tokens', 'Tokens (prompt + completion)'], ['cost', 'Cost (USD)']], 'tokens');
  const problem = h('div');
  const chart = h('div', {id: 'usage-chart'});
  const rowsBox = h('div', {id: 'usage-table'});
  const download = h('button', {type: 'button', id: 'usage-csv'}, 'Download CSV');
  const form = h('form', {class: 'filters', id: 'usage-filters'},
    field('From', since), field('To (inclusive)', until), field('Key', keySelect), field('Tenant', tenant),
    field('Model', modelSelect), field('Batch', batch), field('Stack by', stackBy), field('Show', measure),
    h('div', {class: 'actions'}, h('button', {type: 'submit', class: 'primary'}, 'Apply'), download));

  function params(format) {
    const end = new Date(Date.parse(`${until.value}T00:00:00Z`) + DAY_MS);
    return query({group_by: 'day', since: since.value, until: isoDay(end), key_name: keySelect.value,
      tenant: tenant.value.trim(), model: modelSelect.value, batch_id: batch.value.trim(), format});
  }

  async function load() {
    clear(problem);
    const rows = (await admin(`/usage${params()}`)).data;
    const by = stackBy.value;
    const value = measure.value === 'cost' ? r => r.cost : r => r.prompt_tokens + r.completion_tokens;
    const format = measure.value === 'cost' ? usd : num;
    const categories = days(since.value, until.value);
    // Requests outside any batch have no batch_id: one group of their own.
    const groupOf = r => r[by] || (by === 'batch_id' ? '(no batch)' : '(none)');
    const groups = [...new Set(rows.map(groupOf))].sort();
    const stacks = groups.map(g => ({label: g, values: categories.map(day =>
      rows.filter(r => r.day === day && groupOf(r) === g).reduce((sum, r) => sum + value(r), 0))}));
    const what = measure.value === 'cost' ? 'Cost' : 'Tokens';
    clear(chart).append(stackedBars({title: `${what} per day by ${STACK_BY[by].toLowerCase()}`, categories, stacks, format}));
    const total = rows.reduce((sum, r) => sum + value(r), 0);
    clear(rowsBox).append(table([
      {label: 'Day', value: r => r.day},
      {label: 'Key', value: r => r.key_name},
      {label: 'Tenant', value: r => r.tenant || '—'},
      {label: 'Model', value: r => r.model},
      {label: 'Tier', value: r => r.service_tier ?? 'default'},
      {label: 'Batch', value: r => r.batch_id ?? '—'},
      {label: 'Requests', value: r => num(r.requests), num: true},
      {label: 'Prompt tokens', value: r => num(r.prompt_tokens), num: true},
      {label: 'Cached tokens', value: r => num(r.cached_tokens), num: true},
      {label: 'Completion tokens', value: r => num(r.completion_tokens), num: true},
      // Part of the completion tokens (billed as such): those a reasoning model spent thinking.
      {label: 'Reasoning tokens', value: r => num(r.reasoning_tokens ?? 0), num: true},
      {label: 'Cost', value: r => usd(r.cost), num: true},
    ], rows, `${rows.length} rows · ${what.toLowerCase()} in total: ${format(total)}`));
  }

  async function run(work) {
    try {
      await work();
    } catch (err) {
      clear(problem).append(errorBox(err));
    }
  }

  form.addEventListener('submit', event => {
    event.preventDefault();
    run(load);
  });
  for (const control of [stackBy, measure]) control.addEventListener('change', () => run(load));
  download.addEventListener('click', () => run(async () => {
    const csv = await admin(`/usage${params('csv')}`, {as: 'text'});
    const link = h('a', {href: URL.createObjectURL(new Blob([csv], {type: 'text/csv'})), download: `gantry-usage-${since.value}-${until.value}.csv`});
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  }));

  main.append(h('h1', {}, 'Usage'), form, problem, chart, rowsBox);
  run(async () => {
    const [keys, models] = await Promise.all([admin('/keys'), admin('/models')]);
    for (const name of [...new Set(keys.data.map(k => k.name))].sort()) keySelect.append(h('option', {value: name}, name));
    for (const m of models.data) modelSelect.append(h('option', {value: m.id}, m.id));
    await load();
  });
}
