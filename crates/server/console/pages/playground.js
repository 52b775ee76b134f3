// Playground: chat with a served model through /v1/chat/completions, streamed, with an ordinary
// API key (one created or rotated in this tab, one created here for the purpose, or a pasted
// one), showing each answer's usage and cached prompt tokens.

import {admin, errorFrom, secrets} from '../api.js';
import {clear, errorBox, field, h} from '../dom.js';
import {num} from '../format.js';

/** Reads an SSE body, calling `onData` with each `data:` payload (a string). */
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split('\n')) if (line.startsWith('data: ')) onData(line.slice(6));
    }
  }
}

export function mount(main) {
  const modelSelect = h('select', {name: 'model'});
  const keySelect = h('select', {name: 'key'});
  const pasted = h('input', {type: 'password', name: 'pasted-key', autocomplete: 'off', placeholder: 'sk-gantry-…'});
  const system = h('textarea', {name: 'system', rows: 2}, 'You are a helpful assistant.');
  const temperature = h('input', {type: 'number', name: 'temperature', min: 0, max: 2, step: 0.1, value: 0.7});
  const maxTokens = h('input', {type: 'number', name: 'max_tokens', min: 1, step: 1, value: 256});
  const prompt = h('textarea', {name: 'prompt', rows: 3, required: true, placeholder: 'Ask something…'});
  const send = h('button', {type: 'submit', class: 'primary', id: 'play-send'}, 'Send');
  const stop = h('button', {type: 'button', disabled: true}, 'Stop');
  const log = h('div', {class: 'chat-log', id: 'play-log', 'aria-live': 'polite'});
  const problem = h('div');
  const messages = [];
  let controller = null;

  function fillKeys(selectId) {
    clear(keySelect);
    for (const [id, k] of secrets) keySelect.append(h('option', {value: id, selected: id === selectId}, `${k.name} (created in this tab)`));
    keySelect.append(h('option', {value: 'pasted', selected: selectId === 'pasted' || secrets.size === 0}, 'The key pasted below'));
  }

  function secret() {
    if (keySelect.value === 'pasted') return pasted.value.trim();
    return secrets.get(keySelect.value)?.secret;
  }

  async function createKey() {
    clear(problem);
    try {
      const name = `playground-${new Date().toISOString().slice(0, 19).replace(/[-:T]/g, '')}`;
      const created = await admin('/keys', {method: 'POST', body: {name, tenant: 'playground'}});
      secrets.set(String(created.id), {name: created.name, secret: created.secret});
      fillKeys(String(created.id));
    } catch (err) {
      problem.append(errorBox(err));
    }
  }

  function bubble(role, text) {
    const body = h('div', {class: 'text'}, text);
    const item = h('div', {class: `msg ${role}`}, h('span', {class: 'role'}, role === 'user' ? 'You' : 'Model'), body);
    log.append(item);
    return {item, body};
  }

  async function ask(event) {
    event.preventDefault();
    clear(problem);
    const key = secret();
    if (!key) {
      problem.append(errorBox('Pick a key: create one for the playground, or paste one.'));
      return;
    }
    const text = prompt.value.trim();
    if (!text) return;
    messages.push({role: 'user', content: text});
    bubble('user', text);
    prompt.value = '';
    const answer = bubble('assistant', '');
    answer.item.setAttribute('aria-busy', 'true');
    const usageLine = h('p', {class: 'usage muted'}, 'Streaming…');
    answer.item.append(usageLine);
    controller = new AbortController();
    send.disabled = true;
    stop.disabled = false;
    let reply = '';
    try {
      const body = {
        model: modelSelect.value,
        messages: [...(system.value.trim() ? [{role: 'system', content: system.value.trim()}] : []), ...messages],
        temperature: Number(temperature.value),
        max_tokens: Number(maxTokens.value),
        stream: true,
        stream_options: {include_usage: true},
      };
      const response = await fetch('/v1/chat/completions', {method: 'POST', signal: controller.signal,
        headers: {Authorization: `Bearer ${key}`, 'Content-Type': 'application/json'}, body: JSON.stringify(body)});
      if (!response.ok) throw await errorFrom(response);
      let usage = null;
      await readEvents(response, data => {
        if (data === '[DONE]') return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          reply += delta.content;
          answer.body.textContent = reply;
        }
        if (chunk.usage) usage = chunk.usage;
      });
      messages.push({role: 'assistant', content: reply});
      usageLine.textContent = usage
        ? `Usage: ${num(usage.prompt_tokens)} prompt tokens (${num(usage.prompt_tokens_details?.cached_tokens ?? 0)} cached) · ${num(usage.completion_tokens)} completion tokens · ${num(usage.total_tokens)} total`
        : 'The server sent no usage.';
      usageLine.dataset.cachedTokens = String(usage?.prompt_tokens_details?.cached_tokens ?? '');
    } catch (err) {
      messages.pop();
      usageLine.textContent = err.name === 'AbortError' ? 'Stopped.' : '';
      if (err.name !== 'AbortError') answer.item.append(errorBox(err));
    } finally {
      answer.item.removeAttribute('aria-busy');
      send.disabled = false;
      stop.disabled = true;
      controller = null;
    }
  }

  stop.addEventListener('click', () => controller && controller.abort());
  prompt.addEventListener('keydown', event => {
    if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  const form = h('form', {class: 'chat-form', id: 'play-form'}, field('Message', prompt, 'Ctrl+Enter sends.'),
    h('div', {class: 'actions'}, send, stop,
      h('button', {type: 'button', onclick: () => {
        messages.length = 0;
        clear(log);
      }}, 'Clear conversation')));
  form.addEventListener('submit', ask);

  // A form of its own (never submitted) so the pasted key's password field sits in a form.
  const settings = h('form', {class: 'settings card', 'aria-label': 'Settings', onsubmit: event => event.preventDefault()},
    field('Model', modelSelect),
    field('API key', keySelect),
    h('button', {type: 'button', id: 'play-create-key', onclick: createKey}, 'Create a key for the playground'),
    field('Pasted key', pasted, 'Used when "The key pasted below" is picked; kept in this page only.'),
    field('System prompt', system),
    h('div', {class: 'pair'}, field('Temperature', temperature), field('Max tokens', maxTokens)));

  main.append(h('h1', {}, 'Playground'), problem, h('div', {class: 'playground'}, settings, h('section', {class: 'chat', 'aria-label': 'Conversation'}, log, form)));
  fillKeys();
  admin('/models').then(models => {
    for (const m of models.data) modelSelect.append(h('option', {value: m.id}, `${m.id} (${m.state})`));
  }).catch(err => problem.append(errorBox(err)));
  return () => controller && controller.abort();
}
