// The page of ddblease ui: draws the state its HTML came with, then reads
// /api/state every refreshMs and draws it again. The range and the
// selected run live in the address (?range=, ?to=, ?job=&run=). When a
// reading fails, the last state stays, marked stale with the error and
// its time. Actions (with --allow-actions) post to /api/action with the
// token.
'use strict';

const $ = (sel) => document.querySelector(sel);
const SVG = 'http://www.w3.org/2000/svg';
const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;

let state = null;    // the last reading
let selected = null; // the run shown in #detail: {job, key, run}
let timer = 0;
let token = '';
let pending = null;  // the action awaiting confirmation
const tenures = {};  // job -> fence -> the tenure's start, as this page saw the lease

// el makes an element: attributes (class, on<event>, others) and children.
function el(tag, attrs, ...kids) {
  const e = tag.startsWith('svg:') ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids.flat()) if (k !== undefined && k !== null) e.append(k);
  return e;
}

// Times: UTC first, then the viewer's zone.
const utc = (t) => new Date(t).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
const local = (t) => new Date(t).toLocaleString(undefined, {
  hour12: false, year: 'numeric', month: '2-digit', day: '2-digit',
  hour: '2-digit', minute: '2-digit', second: '2-digit', timeZoneName: 'short'});
function both(t) {
  if (!t) return '—';
  return el('time', {datetime: t}, utc(t), el('br'), el('small', {}, local(t)));
}
function span(ms) {
  const s = Math.abs(ms) / 1000;
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm' + Math.floor(s % 60) + 's';
  if (s < 86400) return Math.floor(s / 3600) + 'h' + Math.floor(s % 3600 / 60) + 'm';
  return Math.floor(s / 86400) + 'd' + Math.floor(s % 86400 / 3600) + 'h';
}
const ago = (t) => {
  const d = Date.parse(state.now) - Date.parse(t);
  return d >= 0 ? span(d) + ' ago' : 'in ' + span(d);
};
const runKey = (r) => r.slot + '|' + (r.trigger || '');

// view is what the address says the page shows: the range, its end, and
// the selected run.
function view() {
  const q = new URLSearchParams();
  if ($('#range').value) q.set('range', $('#range').value);
  if ($('#to').value) q.set('to', new Date($('#to').value).toISOString().replace(/\.\d+Z$/, 'Z'));
  return q;
}

// keepView writes the view into the address, so that a reload or a link
// shows it.
function keepView() {
  const q = view();
  if (selected) { q.set('job', selected.job); q.set('run', selected.key); }
  const s = q.toString();
  history.replaceState(null, '', location.pathname + (s ? '?' + s : ''));
}

async function refresh() {
  clearTimeout(timer);
  try {
    let r, body;
    try {
      r = await fetch('api/state?' + view());
    } catch (e) {
      throw new Error('cannot reach ddblease ui: ' + e.message);
    }
    try {
      body = await r.json();
    } catch (e) {
      throw new Error('ddblease ui answered ' + r.status + ' ' + r.statusText);
    }
    if (!r.ok) {
      if (r.status === 400) { showErrors([body.error]); return; } // the address is wrong, not the table
      throw new Error(body.error || r.statusText);
    }
    state = body;
    render();
  } catch (e) {
    stale(e.message, new Date().toISOString());
  } finally {
    timer = setTimeout(refresh, state ? state.refreshMs : 5000);
  }
}

// stale keeps the last state on the page, marked stale with why it could
// not be read and when.
function stale(error, at) {
  const box = $('#stale');
  box.hidden = false;
  box.replaceChildren(el('p', {}, el('strong', {}, 'Stale:'), ' the table could not be read at ',
    el('time', {class: 'failed-at', datetime: at}, utc(at)), ' (', el('span', {class: 'stale-error'}, error), ')',
    state ? '; shown is the latest reading, of ' + utc(state.now) + '.' : '.'));
}

function showErrors(errs) {
  $('#errors').replaceChildren(...(errs || []).map((e) => el('p', {}, e)));
}

function render() {
  $('#table').textContent = state.table;
  $('#mode').textContent = state.actions ? 'actions allowed' : 'read-only';
  $('#updated').replaceChildren('read ', both(state.now));
  $('#span').textContent = 'from ' + utc(state.from) + ' to ' + utc(state.to);
  if (state.stale) stale(state.stale.error, state.stale.at);
  else $('#stale').hidden = true;
  showErrors(state.stale ? [] : state.errors);
  $('#jobs tbody').replaceChildren(...state.jobs.map(jobRow));
  if (!state.jobs.length) $('#jobs tbody').append(el('tr', {}, el('td', {colspan: 10}, 'no jobs in this table')));
  renderTimelines();
  renderPools();
  if (selected) {
    const j = state.jobs.find((j) => j.job === selected.job);
    const r = j && j.runs.find((r) => runKey(r) === selected.key);
    if (r) selected.run = r;
    showRun(selected.job, selected.run);
  }
}

function badge(text, cls, title) {
  return el('span', {class: 'badge ' + (cls || ''), title}, text);
}

function jobRow(j) {
  const held = j.state === 'held' || j.state === 'draining';
  const states = [badge(j.state, 'st-' + j.state)];
  if (j.paused) states.push(badge('paused', 'paused', 'by ' + j.pausedBy + ' at ' + utc(j.pausedAt)));
  if (j.released) states.push(badge('released', 'warn', 'by ' + j.releasedBy));
  if (j.resignRequested) states.push(badge('resign asked', 'warn', 'by ' + j.resignRequestedBy));
  if (j.catchUpPending) states.push(badge('catch-up pending'));
  if (j.pendingTriggers) states.push(badge(j.pendingTriggers + ' trigger(s) pending'));
  const last = j.lastSlot;
  const fail = j.lastFailure;
  return el('tr', {'data-job': j.job},
    el('th', {class: 'job'}, j.job),
    el('td', {class: 'owner'}, held || j.state === 'released' ? j.holder : '—'),
    el('td', {class: 'fence'}, String(j.fence)),
    el('td', {class: 'since'}, held && j.acquiredAt ? [both(j.acquiredAt), el('br'), el('small', {}, 'held ' + span(Date.parse(state.now) - Date.parse(j.acquiredAt)))] : '—'),
    el('td', {class: 'expiry'}, j.expiresAt ? [both(j.expiresAt), el('br'), el('small', {}, ago(j.expiresAt))] : '—'),
    el('td', {class: 'state'}, states),
    el('td', {class: 'last'}, last ? [badge(last.status, 's-' + last.status), ' ', both(last.slot)] : '—'),
    el('td', {class: 'next'}, j.nextSlot ? [both(j.nextSlot), el('br'), el('small', {}, 'about every ' + span(j.periodMs))] : '—'),
    el('td', {class: 'failure'}, fail ? el('a', {href: '#', onclick: (e) => { e.preventDefault(); select(j.job, fail); }},
      utc(fail.finishedAt), el('br'), el('small', {}, fail.error.slice(0, 80))) : '—'),
    el('td', {class: 'actions'}, state.actions ? actionButtons(j, held) : ''));
}

function actionButtons(j, held) {
  const b = (name, label) => el('button', {type: 'button', 'data-action': name, onclick: () => ask(name, j)}, label);
  return [j.paused ? b('resume', 'Resume') : b('pause', 'Pause'), b('trigger', 'Trigger'), held ? b('resign', 'Resign') : null];
}

// The timelines share one axis: x(t) maps a time to a pixel.
function renderTimelines() {
  const box = $('#timelines');
  const w = Math.max(300, box.clientWidth - 170);
  const from = Date.parse(state.from), to = Date.parse(state.to);
  const x = (t) => Math.max(0, Math.min(w, (Date.parse(t) - from) / (to - from) * w));
  const axis = el('svg:svg', {width: w, height: 22, class: 'axis'});
  for (let i = 0; i <= 4; i++) {
    const t = new Date(from + (to - from) * i / 4).toISOString();
    axis.append(el('svg:line', {x1: x(t), x2: x(t), y1: 16, y2: 22}),
      el('svg:text', {x: x(t), y: 12, 'text-anchor': i === 0 ? 'start' : i === 4 ? 'end' : 'middle'}, utc(t).slice(11)));
  }
  $('#axis').replaceChildren(el('span', {class: 'tl-name'}, 'UTC'), axis);
  box.replaceChildren(...state.jobs.map((j) => {
    const g = el('svg:svg', {width: w, height: 34, 'data-job': j.job});
    g.append(el('svg:line', {class: 'base', x1: 0, x2: w, y1: 17, y2: 17}));
    for (const r of j.runs) {
      const start = r.status === 'skipped-by-pause' ? r.slot : r.startedAt;
      const end = r.finishedAt && r.status !== 'skipped-by-pause' ? r.finishedAt : (r.status === 'running' ? state.now : start);
      const cls = 'run s-' + r.status + (r.trigger ? ' trig' : '') + (selected && selected.key === runKey(r) && selected.job === j.job ? ' sel' : '');
      g.append(el('svg:rect', {class: cls, x: x(start) - 1.5, y: 7, width: Math.max(3, x(end) - x(start) + 3), height: 20,
        'data-slot': r.slot, onclick: () => select(j.job, r)},
      el('svg:title', {}, r.status + (r.trigger ? ' (triggered)' : '') + ', slot ' + utc(r.slot) + ', fence ' + r.fence + ', ' + r.owner)));
    }
    for (const h of tenureStarts(j)) {
      const from = h.fromFence ? 'fence ' + h.fromFence + ' → ' + h.fence : 'fence ' + h.fence;
      g.append(el('svg:line', {class: 'handover', 'data-fence': h.fence, x1: x(h.at), x2: x(h.at), y1: 0, y2: 34},
        el('svg:title', {}, from + ': ' + h.owner + (h.exact ? ' took the lease at ' : ' ran first at ') + utc(h.at))),
      el('svg:text', {class: 'handover', x: x(h.at) + 2, y: 9}, 'f' + h.fence));
    }
    const note = j.error ? el('small', {class: 'err'}, j.error)
      : j.truncated ? el('small', {}, 'the newest ' + state.limit + ' runs; older ones in the range not read') : null;
    return el('div', {class: 'tl'}, el('span', {class: 'tl-name', title: j.job}, j.job), g, note);
  }));
}

// tenureStarts merges the tenure starts the server found (in the runs,
// and the current lease's acquisition) with those this page saw while
// open, which tenures too short to run a slot leave nowhere else; it
// keeps those in the range.
function tenureStarts(j) {
  const seen = tenures[j.job] = tenures[j.job] || {};
  for (const h of j.handovers) if (h.exact) seen[h.fence] = h;
  const all = {...seen};
  for (const h of j.handovers) if (!all[h.fence]) all[h.fence] = h;
  const list = Object.values(all).sort((a, b) => a.fence - b.fence);
  list.forEach((h, i) => { if (!h.fromFence && i > 0) h.fromFence = list[i - 1].fence; });
  const from = Date.parse(state.from), to = Date.parse(state.to);
  return list.filter((h) => Date.parse(h.at) >= from && Date.parse(h.at) <= to);
}

function select(job, run) {
  selected = {job, key: runKey(run), run};
  keepView();
  renderTimelines();
  showRun(job, run);
}

function showRun(job, r) {
  const row = (k, v) => el('tr', {}, el('th', {}, k), el('td', {}, v));
  const d = $('#detail');
  d.hidden = false;
  d.replaceChildren(el('h3', {}, job + ': run of slot ' + utc(r.slot)),
    el('table', {}, row('status', badge(r.status, 's-' + r.status)), r.trigger ? row('trigger', r.trigger) : null,
      row('fence', String(r.fence)), row('claimant', r.owner), row('started', both(r.startedAt)),
      row('finished', both(r.finishedAt)), row('took', r.durationSeconds != null ? span(r.durationSeconds * 1000) : '—'), row('claims', String(r.claims)),
      r.missed ? row('slots missed before it', String(r.missed)) : null),
    r.error ? el('pre', {class: 'error'}, r.error) : el('p', {}, 'no error recorded'),
    el('button', {type: 'button', onclick: () => { selected = null; d.hidden = true; keepView(); renderTimelines(); }}, 'close'));
}

function renderPools() {
  const box = $('#pools');
  if (!state.pools.length) return box.replaceChildren(el('p', {}, 'no pools in this table'));
  box.replaceChildren(...state.pools.map(poolBox));
}

function poolBox(p) {
  const share = p.low === p.high ? p.low : p.low + '–' + p.high;
  const member = (m) => el('tr', {class: m.live ? '' : 'dead'},
    el('td', {}, m.owner + (m.live ? '' : ' (expired)')), el('td', {}, both(m.expiresAt)),
    el('td', {}, m.jobs.length + ': ' + m.jobs.join(', ')),
    el('td', {}, m.declined.length ? m.declined.join(', ') : ''));
  return el('div', {class: 'pool', 'data-pool': p.name},
    el('h3', {}, p.name),
    el('p', {}, p.jobs + ' jobs; each live member should hold ' + share + '; ',
      p.offBy ? badge(p.offBy + ' job(s) to move', 'warn') : badge('balanced', 's-succeeded'),
      p.unheld.length ? ' not held: ' + p.unheld.join(', ') : ''),
    el('table', {}, el('tr', {}, el('th', {}, 'member'), el('th', {}, 'expires'), el('th', {}, 'jobs'),
      el('th', {title: 'jobs an operator asked this member to resign: it leaves them to the others'}, 'declines')),
      p.members.map(member)));
}

const what = {
  pause: (j) => 'RunSchedule on every replica stops firing the slots of ' + j.job + '; slots that fall due are recorded as skipped by the pause. The leader keeps the lease; triggered runs still run.',
  resume: (j) => 'Slots of ' + j.job + ' fire again. Slots skipped during the pause are not run, unless you tick the box.',
  trigger: (j) => 'The leader of ' + j.job + ' runs it once, as an extra run, after its next heartbeat.',
  resign: (j) => 'Ask ' + j.holder + ' (fence ' + j.fence + ') to hand ' + j.job + ' over: at its next heartbeat it drains, resigns and lets another replica lead.',
};

function ask(action, j) {
  pending = {action, job: j.job, fence: j.fence};
  $('#confirm-title').textContent = action[0].toUpperCase() + action.slice(1) + ' ' + j.job + '?';
  $('#confirm-what').textContent = what[action](j);
  $('#catchup-row').hidden = action !== 'resume';
  $('#catchup').checked = false;
  $('#asker').value = localStorage.getItem('ddblease-asker') || '';
  $('#token-row').hidden = !!token;
  $('#confirm-error').textContent = '';
  $('#confirm').showModal();
}

async function confirmAction() {
  const asker = $('#asker').value.trim();
  if (!token) token = $('#token').value.trim();
  if (!asker) return void ($('#confirm-error').textContent = 'Say who you are: it is recorded and logged.');
  localStorage.setItem('ddblease-asker', asker);
  const body = JSON.stringify({...pending, catchUp: $('#catchup').checked, asker});
  try {
    const r = await fetch('api/action', {method: 'POST', body,
      headers: {'Content-Type': 'application/json', 'X-Ddblease-Token': token}});
    const res = await r.json();
    if (!r.ok) {
      if (r.status === 403) { token = ''; sessionStorage.removeItem('ddblease-token'); $('#token-row').hidden = false; }
      $('#confirm-error').textContent = res.error || r.statusText;
      return;
    }
    sessionStorage.setItem('ddblease-token', token);
    $('#notice').textContent = res.message;
    $('#confirm').close();
    refresh();
  } catch (e) {
    $('#confirm-error').textContent = e.message;
  }
}

function init() {
  const h = new URLSearchParams(location.hash.slice(1));
  token = h.get('token') || sessionStorage.getItem('ddblease-token') || '';
  if (h.get('token')) {
    sessionStorage.setItem('ddblease-token', token);
    history.replaceState(null, '', location.pathname + location.search); // the token leaves the address bar
  }
  const q = new URLSearchParams(location.search);
  const range = q.get('range') || '';
  if (![...$('#range').options].some((o) => o.value === range)) $('#range').append(el('option', {value: range}, range));
  $('#range').value = range;
  if (q.get('to') && !isNaN(Date.parse(q.get('to')))) {
    const t = new Date(q.get('to'));
    $('#to').value = new Date(t - t.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
  }
  const off = -new Date().getTimezoneOffset();
  $('#zone').textContent = 'Times in UTC, then in your zone: ' + zone + ' (UTC' + (off < 0 ? '−' : '+') +
    String(Math.floor(Math.abs(off) / 60)).padStart(2, '0') + ':' + String(Math.abs(off) % 60).padStart(2, '0') + ').';
  const changed = () => { keepView(); refresh(); };
  $('#range').addEventListener('change', changed);
  $('#to').addEventListener('change', changed);
  $('#now').addEventListener('click', () => { $('#to').value = ''; changed(); });
  $('#confirm-ok').addEventListener('click', confirmAction);
  $('#confirm-cancel').addEventListener('click', () => $('#confirm').close());
  window.addEventListener('resize', () => state && renderTimelines());
  const first = $('#initial-state');
  if (!first) return void refresh();
  state = JSON.parse(first.textContent);
  const job = state.jobs.find((j) => j.job === q.get('job'));
  const run = job && job.runs.find((r) => runKey(r) === q.get('run'));
  if (run) selected = {job: job.job, key: runKey(run), run};
  render();
  timer = setTimeout(refresh, state.refreshMs);
}

init();
