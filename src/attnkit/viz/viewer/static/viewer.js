/* attnkit attention viewer: head, model and matrix views of attention weights.
 *
 * Plain JavaScript without dependencies, inlined into one HTML page. The data is the JSON
 * in <script type="application/json" id="attnkit-data"> (an exported file) or, in app mode
 * (body[data-mode="app"]), what POST api/attention returns. Its schema and the weight
 * encoding (uint16 of w * 65535, little-endian, zlib, base64, one string per layer) are in
 * docs/viewer.md.
 *
 * body[data-state] is "loading" while a view is being drawn and "ready" once it is, so that
 * tests and scripts know when to look; "empty" in app mode before the first request,
 * "error" after a failure.
 */
(function () {
  'use strict';

  const $ = (id) => document.getElementById(id);
  const body = document.body;
  const dpr = window.devicePixelRatio || 1;

  const ROW = 20; // head view: CSS px per token row (matches --ak-row)
  const THUMB = 64; // model view: largest side of a thumbnail, in cells and CSS px
  const ALPHA_BUCKETS = 8; // head view: lines are batched into this many opacities
  const MIN_ALPHA = 0.02; // head view: fainter lines are invisible and not drawn
  const ALL_LINES_MIN = 0.001; // head view, "all" lines: weights below this are skipped
  const MAX_LABEL = 150; // matrix view: widest token label, CSS px
  const ALL_LINES_MAX_TOKENS = 300; // head view: "all" lines are offered up to this many tokens
  const RANK_ROWS = 30; // rank view: rows listed
  const TARGET_TOKENS_SHOWN = 12; // an encoder-decoder's target that reads as no text: tokens shown

  // matplotlib's "Blues" (the heatmaps' colour map): nine anchors, interpolated to 256.
  const BLUES = [[247, 251, 255], [222, 235, 247], [198, 219, 239], [158, 202, 225], [107, 174, 214],
    [66, 146, 198], [33, 113, 181], [8, 81, 156], [8, 48, 107]];
  const LUT = (() => {
    const lut = new Uint8ClampedArray(256 * 3);
    for (let n = 0; n < 256; n++) {
      const x = (n / 255) * (BLUES.length - 1);
      const a = Math.floor(x);
      const b = Math.min(a + 1, BLUES.length - 1);
      const f = x - a;
      for (let c = 0; c < 3; c++) lut[n * 3 + c] = Math.round(BLUES[a][c] * (1 - f) + BLUES[b][c] * f);
    }
    return lut;
  })();
  const MASKED = [226, 226, 226]; // cells a query may not attend to: later keys, keys outside a local window
  const PALETTE = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf',
    '#bcbd22', '#7f7f7f', '#393b79', '#637939'];
  const headColour = (n) => (n < PALETTE.length ? PALETTE[n] : 'hsl(' + ((n * 137.508) % 360).toFixed(1) + ', 65%, 42%)');

  const SCALES = {
    linear: { title: 'Colour: QUANTITY', ticks: [[0, '0'], [0.25, '0.25'], [0.5, '0.5'], [0.75, '0.75'], [1, '1']] },
    sqrt: { title: 'Colour: QUANTITY (square-root scale)',
      ticks: [[0, '0'], [0.1, '0.01'], [Math.sqrt(0.05), '0.05'], [0.5, '0.25'], [1, '1']] },
    row: { title: "Colour: share of the row's largest QUANTITYWORD", ticks: [[0, '0%'], [0.5, '50%'], [1, '100%']] },
  };
  // What a section's numbers are: the legend's title, the tooltip's and the scale menu's word.
  const QUANTITIES = {
    value: { legend: 'value-weighted norm \u2016\u03b1\u00b7f(x)\u2016, each map scaled so that its largest is 1',
      word: 'value norm', short: 'norm', scaleLabel: 'value-weighted norm, 0 to 1 (scaled per map)' },
    rollout: { legend: 'attention rollout (layers up to this one, heads merged)', word: 'rollout', short: 'rollout',
      scaleLabel: 'rollout, 0 to 1' },
  };
  const WEIGHT = { legend: 'attention weight', word: 'weight', short: 'weight', scaleLabel: 'weight, 0 to 1' };
  const quantity = () => (state.data && QUANTITIES[state.section]) || WEIGHT;

  const state = {
    data: null, // the parsed JSON
    section: '', // section name
    layer: 0, // index into the section's layers
    head: 0, // index into the section's heads
    view: 'head',
    scale: 'linear',
    topk: 5, // head view lines per query; 0 = all
    headsOn: [], // head view: shown or not, per head index
    activeQ: -1, // head view: isolated query token
    activeK: -1, // head view: isolated key token
    pinnedQ: -1, // a clicked query token: kept across layers, heads and views
    pinnedK: -1, // a clicked key token
    zoom: 0, // matrix view: CSS px per cell, 0 to fit the width
    reduce: 'max', // long view: each block's largest weight ('max') or its mean ('mean')
    cursor: null, // matrix view keyboard cell {i, j}
    rankQ: null, // rank view: the chosen query index (null: the pinned query, else the last)
    rankK: null, // rank view: the chosen key index, -1 for any (null: the pinned key, else any)
  };
  let generation = 0; // bumped by every render; stale asynchronous work sees it and stops
  let decoded = new Map(); // "section/layer" -> Promise<Uint16Array [h * s_q * s_k]>
  let resolved = new Map(); // the same, for layers already decoded (read synchronously)

  // ---------------------------------------------------------------- data

  const sec = () => state.data.sections[state.section];
  const dims = (s) => ({ L: s.weights.shape[0], h: s.weights.shape[1], sq: s.weights.shape[2], sk: s.weights.shape[3] });
  const shown = (t) => (t === '' ? '\u2205' : t.replace(/\n/g, '\u21b5').replace(/\t/g, '\u2192'));

  // The bytes of a base64 string of zlib-compressed data.
  async function inflate(b64) {
    const text = atob(b64);
    const packed = new Uint8Array(text.length);
    for (let n = 0; n < text.length; n++) packed[n] = text.charCodeAt(n);
    const stream = new Blob([packed]).stream().pipeThrough(new DecompressionStream('deflate'));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  // `count` little-endian unsigned 16-bit integers of `bytes` (`what` names them in an error).
  function uint16s(bytes, count, what) {
    if (bytes.length !== 2 * count) throw new Error(what + ': expected ' + 2 * count + ' bytes, got ' + bytes.length);
    const out = new Uint16Array(count);
    for (let n = 0; n < count; n++) out[n] = bytes[2 * n] | (bytes[2 * n + 1] << 8);
    return out;
  }

  async function decodeLayer(section, li) {
    const d = dims(section);
    return uint16s(await inflate(section.weights.data[li]), d.h * d.sq * d.sk, 'layer ' + section.layers[li] + ' weights');
  }

  function layerData(li) {
    const key = state.section + '/' + li;
    if (!decoded.has(key)) {
      decoded.set(key, decodeLayer(sec(), li).then((q16) => { resolved.set(key, q16); return q16; }));
    }
    return decoded.get(key);
  }

  // The sliding window of layer index li of section s (a local layer), or 0 (global).
  const windowOf = (s, li) => (s.windows && s.windows[li]) || 0;

  // Whether query i may not attend to key j in layer index li: a later key (causal) or a key
  // outside a local layer's window.
  function masked(s, li, i, j) {
    if (s.causal && j > i) return true;
    const w = windowOf(s, li);
    return w > 0 && i - j >= w;
  }

  // "local (512)" or "global" for a section with local layers, else "".
  function layerKind(s, li) {
    if (!s.windows) return '';
    const w = windowOf(s, li);
    return w > 0 ? 'local (' + w + ')' : 'global';
  }

  const layerName = (s, li) => 'layer ' + s.layers[li] + (s.windows ? ' \u00b7 ' + layerKind(s, li) : '');

  // Colour intensity in [0, 1] of every cell of one [s_q, s_k] map under the current scale.
  function intensities(q16, offset, sq, sk, unit) {
    const out = new Float32Array(sq * sk);
    for (let i = 0; i < sq; i++) {
      const row = offset + i * sk;
      let norm = unit;
      if (state.scale === 'row') {
        let m = 0;
        for (let j = 0; j < sk; j++) if (q16[row + j] > m) m = q16[row + j];
        norm = m > 0 ? 1 / m : 0;
      }
      for (let j = 0; j < sk; j++) {
        const v = q16[row + j] * norm;
        out[i * sk + j] = state.scale === 'sqrt' ? Math.sqrt(v) : v;
      }
    }
    return out;
  }

  // Opacity of a head-view line for weight w (quantised) in a row whose largest is rowMax.
  function alphaOf(q, rowMax, unit) {
    if (state.scale === 'row') return rowMax > 0 ? q / rowMax : 0;
    return state.scale === 'sqrt' ? Math.sqrt(q * unit) : q * unit;
  }

  // ---------------------------------------------------------------- loading

  // What the page shows now, for load() to keep when new data has the same tokens (the app's
  // Show attention again, with other layers or heads).
  function shownNow() {
    if (!state.data || state.view === 'long') return null;
    const s = sec();
    return { section: state.section, layer: s.layers[state.layer], head: s.heads[state.head],
      tokens: s.query_tokens.join('\u0000') + '\u0001' + s.key_tokens.join('\u0000'), level: state.data.level,
      headsOn: new Map(s.heads.map((h, n) => [h, state.headsOn[n]])), scale: state.scale, topk: state.topk };
  }

  function load(json) {
    if (json && json.format === 'attnkit-viewer-long') {
      loadLong(longFromPage(json));
      return;
    }
    if (!json || json.format !== 'attnkit-viewer' || json.version !== 1) {
      throw new Error('this is not attnkit viewer data (expected format "attnkit-viewer", version 1)');
    }
    const before = shownNow();
    state.data = json;
    decoded = new Map();
    resolved = new Map();
    const names = Object.keys(json.sections);
    const select = $('ak-section');
    select.textContent = '';
    const labels = { self: 'self-attention', encoder: 'encoder self-attention', decoder: 'decoder self-attention (causal)',
      cross: 'cross-attention (decoder to encoder)',
      value: 'value-weighted \u2016\u03b1\u00b7f(x)\u2016 (each map scaled to its largest)',
      rollout: 'attention rollout (layers below and heads merged)' };
    for (const name of names) select.add(new Option(labels[name] || name, name));
    $('ak-section-field').hidden = names.length < 2;
    let longest = 0;
    for (const name of names) longest = Math.max(longest, ...json.sections[name].weights.shape.slice(2));
    // The same tokens again keep every choice: section, layer, head, heads shown, selected
    // tokens, ranked query and key, scale and lines per query.
    const name = before && json.sections[before.section] ? before.section : json.sections.cross ? 'cross' : names[0];
    const s = json.sections[name];
    const kept = before && before.level === json.level &&
      before.tokens === s.query_tokens.join('\u0000') + '\u0001' + s.key_tokens.join('\u0000') ? before : null;
    if (!kept) state.pinnedQ = state.pinnedK = -1;
    if (!kept) state.rankQ = state.rankK = null;
    state.scale = kept ? kept.scale : longest <= 64 ? 'linear' : 'sqrt';
    state.topk = kept ? kept.topk : longest <= 32 ? 0 : 5;
    // Every line of every token: thousands of lines per scroll frame beyond a few hundred tokens.
    const all = $('ak-topk').querySelector('option[value="0"]');
    all.disabled = longest > ALL_LINES_MAX_TOKENS;
    all.text = all.disabled ? 'all (up to ' + ALL_LINES_MAX_TOKENS + ' tokens)' : 'all';
    $('ak-scale').value = state.scale;
    $('ak-topk').value = String(state.topk);
    const kinds = { causal: 'causal self-attention', bidirectional: 'bidirectional self-attention',
      'encoder-decoder': 'encoder\u2013decoder' };
    const counts = names.map((n) => json.sections[n].query_tokens.length);
    const unit = json.level === 'word' ? ' words' : ' tokens';
    const tokens = json.kind === 'encoder-decoder' ? encoderDecoderCounts(json, unit) : Math.max(...counts) + unit;
    $('ak-summary').textContent = modelLabel(json.model) + ' \u00b7 ' + (kinds[json.kind] || json.kind) + ' \u00b7 ' + tokens;
    $('ak-text-shown').textContent = json.kind === 'encoder-decoder'
      ? 'Source: \u201c' + json.text + '\u201d \u00b7 ' + targetText(json) +
        (json.generated ? ' (written by the model, greedy decoding)' : '')
      : json.text ? 'Text: \u201c' + json.text + '\u201d' : '';
    document.title = 'Attention: ' + modelLabel(json.model);
    $('ak-title').textContent = document.title;
    $('ak-main').hidden = false;
    $('ak-model-note').hidden = true; // what it said was about the previous data
    // After a long view (in the app), the page opens on the head view again.
    const wasLong = state.view === 'long';
    long = null;
    if (wasLong) state.view = 'head';
    // An encoder-decoder opens on cross-attention, as attnkit inspect prints it.
    setSection(name, !kept, kept);
    if (wasLong) setView('head', false);
  }

  // "target: “…”", or for a target whose tokens read as no text (special tokens only) the tokens.
  function targetText(json) {
    if (json.target_text) return 'target: \u201c' + json.target_text + '\u201d';
    const rows = (json.sections.cross || json.sections.decoder || { query_tokens: [] }).query_tokens;
    if (!rows.length) return 'no target';
    const first = rows.slice(0, TARGET_TOKENS_SHOWN).map(shown).join(' ');
    return 'target tokens (they read as no text): ' + first + (rows.length > TARGET_TOKENS_SHOWN ? ' \u2026' : '');
  }

  // "11 source and 9 target tokens": the source from the encoder or cross section, the target
  // from the cross or decoder section (rows are target tokens).
  function encoderDecoderCounts(json, unit) {
    const { encoder, decoder, cross } = json.sections;
    const source = cross ? cross.key_tokens.length : encoder ? encoder.query_tokens.length : 0;
    const target = cross ? cross.query_tokens.length : decoder ? decoder.query_tokens.length : 0;
    return source + ' source' + (target ? ' and ' + target + ' target' : '') + unit +
      (target ? '' : ' (no decoder layer computed)');
  }

  // What the rows and columns of the current section are, in words.
  function axesText() {
    const name = state.section;
    if (name === 'cross') {
      return 'Rows: target tokens (the decoder\u2019s queries). Columns: source tokens (the encoder\u2019s keys). ' +
        'Each row is the position that produces that target token.';
    }
    if (name === 'decoder') {
      return 'Rows: target tokens, each the token its position produces. Columns: the tokens the decoder reads, ' +
        'one position behind: the start token, then the target without its last token.';
    }
    if (name === 'encoder') return 'Rows and columns: source tokens (the encoder\u2019s text).';
    return '';
  }

  // Show section `name`, on its last layer when `lastLayer`; `kept` (from shownNow) is what the
  // page showed before new data with the same tokens came (default: the current section).
  function setSection(name, lastLayer, kept) {
    const previous = kept ? null : state.data.sections[state.section];
    const oldLayer = kept ? kept.layer : previous ? previous.layers[state.layer] : undefined;
    const oldHead = kept ? kept.head : previous ? previous.heads[state.head] : undefined;
    state.section = name;
    $('ak-section').value = name;
    const s = sec();
    // Keep the same model layer and head when the new section has them.
    state.layer = lastLayer || !s.layers.includes(oldLayer) ? s.layers.length - 1 : s.layers.indexOf(oldLayer);
    state.head = s.heads.includes(oldHead) ? s.heads.indexOf(oldHead) : 0;
    state.headsOn = s.heads.map((h) => !kept || !kept.headsOn.has(h) || kept.headsOn.get(h));
    // A clicked token stays selected in a section with the same tokens (self, value, rollout).
    const same = kept || (previous && previous.query_tokens.join('\u0000') === s.query_tokens.join('\u0000') &&
      previous.key_tokens.join('\u0000') === s.key_tokens.join('\u0000'));
    if (!same) state.pinnedQ = state.pinnedK = -1;
    if (!same) state.rankQ = state.rankK = null;
    state.activeQ = state.pinnedQ;
    state.activeK = state.pinnedK;
    state.cursor = null;
    const layerSelect = $('ak-layer');
    layerSelect.textContent = '';
    s.layers.forEach((v, n) => layerSelect.add(new Option(layerName(s, n), String(n))));
    layerSelect.value = String(state.layer);
    fillSelect($('ak-head'), s.heads, 'head', state.head);
    const merged = name === 'rollout';
    if (merged) $('ak-head').options[0].text = 'all heads, merged';
    // A merged map has no heads to switch on and off.
    $('ak-heads').hidden = merged;
    $('ak-scale').options[0].text = quantity().scaleLabel;
    $('ak-tab-rank').textContent = merged ? 'Rank layers' : 'Rank heads';
    $('ak-axes').textContent = axesText();
    $('ak-axes').hidden = !axesText();
    fillRankPickers();
    buildTokenColumns();
    buildHeadToggles();
    buildGrid();
    render();
  }

  function fillSelect(select, values, word, selected) {
    select.textContent = '';
    values.forEach((v, n) => select.add(new Option(word + ' ' + v, String(n))));
    select.value = String(selected);
  }

  // ---------------------------------------------------------------- rendering

  async function render() {
    const gen = ++generation;
    body.dataset.state = 'loading';
    drawLegend();
    try {
      if (state.view === 'head') await renderHead(gen);
      else if (state.view === 'model') await renderModel(gen);
      else if (state.view === 'rank') await renderRank(gen);
      else if (state.view === 'long') await renderLong(gen);
      else await renderMatrix(gen);
      if (gen === generation) body.dataset.state = 'ready';
    } catch (err) {
      if (gen === generation) fail(err);
    }
  }

  function fail(err) {
    body.dataset.state = 'error';
    const box = $('ak-error');
    box.textContent = 'The viewer could not draw this data: ' + (err && err.message ? err.message : err);
    box.hidden = false;
  }

  function drawLegend() {
    const scale = SCALES[state.scale];
    const bar = $('ak-legend-bar');
    const ctx = bar.getContext('2d');
    const img = ctx.createImageData(bar.width, bar.height);
    for (let x = 0; x < bar.width; x++) {
      const n = Math.round((255 * x) / (bar.width - 1));
      for (let y = 0; y < bar.height; y++) {
        const p = (y * bar.width + x) * 4;
        img.data[p] = LUT[n * 3];
        img.data[p + 1] = LUT[n * 3 + 1];
        img.data[p + 2] = LUT[n * 3 + 2];
        img.data[p + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
    const q = quantity();
    $('ak-legend-title').textContent = scale.title.replace('QUANTITYWORD', q.word).replace('QUANTITY', q.legend);
    const ticks = $('ak-legend-ticks');
    ticks.textContent = '';
    for (const [pos, label] of scale.ticks) {
      const span = document.createElement('span');
      span.textContent = label;
      span.style.left = pos * 100 + '%';
      ticks.appendChild(span);
    }
    const notes = [];
    if (state.view === 'head') notes.push('Head view: a line\u2019s opacity follows this scale, its colour is the head.');
    if (state.data && state.view !== 'head') {
      const s = sec();
      const w = windowOf(s, state.layer);
      const layerWord = state.view === 'model' ? 'local layers' : 'this local layer';
      if (s.causal && (w || (s.windows && state.view === 'model'))) {
        notes.push('Grey: masked, a token may not attend to later tokens, nor, in ' + layerWord + ', to tokens ' +
          (w || 'a window') + ' or more positions back.');
      } else if (s.causal) {
        notes.push('Grey: masked, a token may not attend to later tokens.');
      } else if (w) {
        notes.push('Grey: masked, in this local layer a token may not attend to tokens ' + w + ' or more positions away.');
      }
    }
    if (long && state.view === 'long') notes.push(longLegendNote());
    if (state.data && state.view === 'matrix' && matrixFitCell > 0 && matrix && !matrix.labels && !state.zoom) {
      notes.push('Cells are ' + (matrixFitCell < 1 ? matrixFitCell.toFixed(2) : matrixFitCell.toFixed(1)) +
        ' px, too small for labels: choose a larger Cell size to zoom in.');
    }
    $('ak-legend-note').textContent = notes.join(' ');
  }

  // ---------------------------------------------------------------- head view

  let lines = null; // {key, q16, heads: [{off, keys, q, rowMax}]}: each query's strongest keys

  // Whether each token starts a word, for a section between tokens of one text (the colour
  // modes share the self section's tokens); null when unknown or when every token is a word.
  function wordStarts(s) {
    const self = state.data.sections.self;
    const starts = s.word_starts || (self && s.query_tokens.length === self.query_tokens.length ? self.word_starts : null);
    return starts && starts.some((b) => !b) ? starts : null;
  }

  // A conversation in a chat template: the turns of a section between its tokens (or
  // words), the colour modes sharing the self section's; null for a plain text.
  function turnsOf(s) {
    const self = state.data.sections.self;
    return s.turns || (self && s.query_tokens.length === self.query_tokens.length ? self.turns : null) || null;
  }

  const ROLE_COLOURS = { system: '#8250df', user: '#0969da', assistant: '#1a7f37' };

  function roleColour(role) {
    return ROLE_COLOURS[role] || '#bc4c00';
  }

  // The index of the turn that token (or word) n belongs to, -1 for none.
  function turnIndex(turns, n) {
    return turns ? turns.findIndex((t) => n >= t.start && n < t.stop) : -1;
  }

  // What a token's turn says in a tooltip: ' (turn 2, user; role marker)'.
  function turnNote(turns, n) {
    const k = turnIndex(turns, n);
    if (k < 0) return turns ? ' (no turn: the template\u2019s)' : '';
    const t = turns[k];
    const marker = n < t.content_start || n >= t.content_stop;
    return ' (turn ' + (k + 1) + ', ' + t.role + (marker ? '; role marker' : '') + ')';
  }

  // The list of turns above the views, each in its role's colour.
  function showTurns(turns) {
    const box = $('ak-turns');
    box.textContent = '';
    box.hidden = !turns;
    if (!turns) return;
    box.append('Chat turns, the band beside each token (italic: the template\u2019s role markers): ');
    const unit = state.data.level === 'word' ? 'words' : 'tokens';
    turns.forEach((t, k) => {
      const chip = document.createElement('span');
      chip.className = 'ak-turn-chip';
      chip.dataset.role = t.role;
      chip.style.setProperty('--ak-turn', roleColour(t.role));
      chip.textContent = (k + 1) + '. ' + t.role + ': ' + unit + ' ' + t.start + '\u2013' + (t.stop - 1);
      box.appendChild(chip);
    });
  }

  function buildTokenColumns() {
    const s = sec();
    const starts = wordStarts(s);
    const turns = turnsOf(s);
    showTurns(turns);
    for (const [el, tokens, side] of [[$('ak-queries'), s.query_tokens, 'q'], [$('ak-keys'), s.key_tokens, 'k']]) {
      el.textContent = '';
      el.removeAttribute('aria-activedescendant');
      const frag = document.createDocumentFragment();
      tokens.forEach((t, n) => {
        const div = document.createElement('div');
        div.className = 'ak-token';
        div.id = 'ak-' + side + '-' + n;
        div.setAttribute('role', 'option');
        div.setAttribute('aria-selected', 'false');
        div.dataset.index = String(n);
        div.textContent = shown(t);
        div.title = (side === 'q' ? 'query #' : 'key #') + n + ': ' + t;
        // A line above each word's first token: labels stripped of their spaces hide where
        // words start (two "배" of two words).
        if (starts && starts[n] && n > 0) {
          div.classList.add('ak-word-start');
          div.title += ' (starts a word)';
        }
        const k = turnIndex(turns, n);
        if (k >= 0) {
          const t = turns[k];
          div.classList.add('ak-in-turn');
          div.style.setProperty('--ak-turn', roleColour(t.role));
          div.dataset.role = t.role;
          if (n < t.content_start || n >= t.content_stop) div.classList.add('ak-role-marker');
        }
        div.title += turnNote(turns, n);
        frag.appendChild(div);
      });
      el.appendChild(frag);
    }
    $('ak-head-inner').style.height = Math.max(s.query_tokens.length, s.key_tokens.length) * ROW + 'px';
    lines = null;
    showPinned();
  }

  function buildHeadToggles() {
    const box = $('ak-head-toggles');
    box.textContent = '';
    sec().heads.forEach((head, n) => {
      const label = document.createElement('label');
      label.className = 'ak-head-toggle';
      const input = document.createElement('input');
      input.type = 'checkbox';
      input.checked = state.headsOn[n];
      input.dataset.index = String(n);
      input.id = 'ak-toggle-' + n;
      const swatch = document.createElement('span');
      swatch.className = 'ak-swatch';
      swatch.style.background = headColour(head);
      label.append(input, swatch, 'head ' + head);
      box.appendChild(label);
    });
  }

  // For every head, the strongest `k` keys of each query (all above ALL_LINES_MIN when
  // k = 0), as compressed rows: query i's lines are off[i] .. off[i + 1].
  function strongestKeys(q16, d, k, unit) {
    const floor = Math.ceil(ALL_LINES_MIN / unit);
    const heads = [];
    for (let h = 0; h < d.h; h++) {
      const off = new Int32Array(d.sq + 1);
      const rowMax = new Float32Array(d.sq);
      const keys = [];
      const qs = [];
      const topJ = new Int32Array(Math.max(k, 1));
      const topQ = new Int32Array(Math.max(k, 1));
      for (let i = 0; i < d.sq; i++) {
        const row = (h * d.sq + i) * d.sk;
        let m = 0;
        let count = 0;
        for (let j = 0; j < d.sk; j++) {
          const q = q16[row + j];
          if (q > m) m = q;
          if (q === 0) continue;
          if (k === 0) {
            if (q >= floor) { keys.push(j); qs.push(q); }
            continue;
          }
          if (count === k && q <= topQ[k - 1]) continue;
          // Insert into the short descending list.
          let p = count < k ? count++ : k - 1;
          while (p > 0 && topQ[p - 1] < q) { topQ[p] = topQ[p - 1]; topJ[p] = topJ[p - 1]; p--; }
          topQ[p] = q;
          topJ[p] = j;
        }
        for (let n = 0; n < count; n++) { keys.push(topJ[n]); qs.push(topQ[n]); }
        rowMax[i] = m;
        off[i + 1] = keys.length;
      }
      heads.push({ off, keys: Int32Array.from(keys), q: Uint16Array.from(qs), rowMax });
    }
    return heads;
  }

  async function renderHead(gen) {
    const s = sec();
    const d = dims(s);
    const q16 = await layerData(state.layer);
    if (gen !== generation) return;
    const key = state.section + '/' + state.layer + '/' + state.topk;
    if (!lines || lines.key !== key) {
      lines = { key, q16, heads: strongestKeys(q16, d, state.topk, s.weights.scale) };
    }
    sizeLinesCanvas();
    drawLines();
  }

  function sizeLinesCanvas() {
    const canvas = $('ak-lines');
    const scroll = $('ak-head-scroll');
    const inner = $('ak-head-inner');
    const w = canvas.parentElement.clientWidth;
    const h = Math.min(scroll.clientHeight, inner.offsetHeight);
    canvas.style.height = h + 'px';
    canvas.width = Math.max(1, Math.round(w * dpr));
    canvas.height = Math.max(1, Math.round(h * dpr));
  }

  function drawLines() {
    if (!lines || !state.data) return;
    const s = sec();
    const d = dims(s);
    const unit = s.weights.scale;
    const canvas = $('ak-lines');
    const ctx = canvas.getContext('2d');
    const W = canvas.width / dpr;
    const H = canvas.height / dpr;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, W, H);
    // The canvas sticks to the top of the scroll box, so content y maps to y - scrollTop.
    const top = $('ak-head-scroll').scrollTop;
    const y = (n) => n * ROW + ROW / 2 - top;
    // Lines of the queries in view and one screen above and below; lines of far-away
    // queries appear when they are scrolled to (this is what keeps 1,000+ tokens fast).
    const first = Math.max(0, Math.floor((top - H) / ROW));
    const last = Math.min(d.sq - 1, Math.ceil((top + 2 * H) / ROW));
    ctx.lineWidth = Math.max(d.sq, d.sk) <= 50 ? 2 : 1.25;
    s.heads.forEach((head, h) => {
      if (!state.headsOn[h]) return;
      const hl = lines.heads[h];
      const buckets = Array.from({ length: ALPHA_BUCKETS }, () => new Path2D());
      const add = (i, j, q) => {
        const a = alphaOf(q, hl.rowMax[i], unit);
        if (a < MIN_ALPHA) return;
        const b = Math.min(ALPHA_BUCKETS - 1, Math.floor(a * ALPHA_BUCKETS));
        buckets[b].moveTo(0, y(i));
        buckets[b].lineTo(W, y(j));
      };
      const base = h * d.sq * d.sk;
      if (state.activeQ >= 0) {
        const row = base + state.activeQ * d.sk;
        for (let j = 0; j < d.sk; j++) add(state.activeQ, j, lines.q16[row + j]);
      } else if (state.activeK >= 0) {
        for (let i = 0; i < d.sq; i++) add(i, state.activeK, lines.q16[base + i * d.sk + state.activeK]);
      } else {
        for (let i = first; i <= last; i++) {
          for (let n = hl.off[i]; n < hl.off[i + 1]; n++) add(i, hl.keys[n], hl.q[n]);
        }
      }
      ctx.strokeStyle = headColour(head);
      buckets.forEach((path, b) => {
        ctx.globalAlpha = (b + 0.5) / ALPHA_BUCKETS;
        ctx.stroke(path);
      });
    });
    ctx.globalAlpha = 1;
  }

  function setActive(side, n, fromKeyboard) {
    for (const el of document.querySelectorAll('.ak-token.ak-active')) {
      el.classList.remove('ak-active');
      el.setAttribute('aria-selected', 'false');
    }
    state.activeQ = side === 'q' ? n : -1;
    state.activeK = side === 'k' ? n : -1;
    if (n >= 0) {
      const el = $('ak-' + side + '-' + n);
      el.classList.add('ak-active');
      el.setAttribute('aria-selected', 'true');
      $(side === 'q' ? 'ak-queries' : 'ak-keys').setAttribute('aria-activedescendant', el.id);
      if (fromKeyboard) el.scrollIntoView({ block: 'nearest' });
    }
    drawLines();
  }

  // Back to the clicked token's lines (or every line when none is clicked).
  function showPinned() {
    for (const el of document.querySelectorAll('.ak-token.ak-pinned-token')) el.classList.remove('ak-pinned-token');
    const side = state.pinnedQ >= 0 ? 'q' : state.pinnedK >= 0 ? 'k' : '';
    const n = side === 'q' ? state.pinnedQ : state.pinnedK;
    if (side) $('ak-' + side + '-' + n).classList.add('ak-pinned-token');
    setActive(side || 'q', side ? n : -1, false);
    // Hidden without giving up its room, so that the tokens under the pointer stay put.
    const box = $('ak-pinned');
    box.classList.toggle('ak-invisible', !side);
    if (side) {
      const s = sec();
      $('ak-pinned-text').textContent = 'Selected ' + (side === 'q' ? 'query' : 'key') + ' token \u201c' +
        shown(side === 'q' ? s.query_tokens[n] : s.key_tokens[n]) + '\u201d #' + n + ', kept across layers and heads.';
      $('ak-pinned-rank').hidden = side !== 'q';
    }
  }

  // Click a token to keep it selected (click it again, or press Escape, to let it go).
  function pin(side, n) {
    const again = side === 'q' ? state.pinnedQ === n : state.pinnedK === n;
    state.pinnedQ = side === 'q' && !again ? n : -1;
    state.pinnedK = side === 'k' && !again ? n : -1;
    if (state.pinnedQ >= 0) $('ak-rank-q').value = String(state.rankQ = state.pinnedQ);
    if (state.pinnedK >= 0 && state.pinnedK < $('ak-rank-k').options.length - 1) {
      $('ak-rank-k').value = String(state.rankK = state.pinnedK);
    }
    showPinned();
  }

  // Escape lets a selected token go wherever the focus is (a token column, a map, a button).
  function releaseOnEscape(e) {
    if (e.key !== 'Escape' || !state.data || (state.pinnedQ < 0 && state.pinnedK < 0)) return;
    state.pinnedQ = state.pinnedK = -1;
    showPinned();
  }

  function tokenColumnEvents(el, side) {
    const count = () => (side === 'q' ? sec().query_tokens.length : sec().key_tokens.length);
    const current = () => (side === 'q' ? state.activeQ : state.activeK);
    el.addEventListener('mouseover', (e) => {
      const t = e.target.closest('.ak-token');
      if (t) setActive(side, Number(t.dataset.index), false);
    });
    el.addEventListener('mouseleave', () => {
      if (document.activeElement !== el || state.pinnedQ >= 0 || state.pinnedK >= 0) showPinned();
    });
    el.addEventListener('click', (e) => {
      const t = e.target.closest('.ak-token');
      if (t) pin(side, Number(t.dataset.index));
    });
    el.addEventListener('focus', () => {
      if (current() < 0) setActive(side, Math.min(count() - 1, Math.floor($('ak-head-scroll').scrollTop / ROW)), true);
    });
    // Leaving the column (for the layer picker, say) keeps a clicked token selected.
    el.addEventListener('blur', () => showPinned());
    el.addEventListener('keydown', (e) => {
      const n = current();
      const moves = { ArrowDown: n + 1, ArrowUp: n - 1, PageDown: n + 10, PageUp: n - 10, Home: 0, End: count() - 1 };
      if (e.key === 'Escape') {
        state.pinnedQ = state.pinnedK = -1;
        showPinned();
      } else if (e.key === 'Enter' || e.key === ' ') {
        e.preventDefault();
        if (n >= 0) pin(side, n);
      } else if (e.key in moves) {
        e.preventDefault();
        setActive(side, Math.max(0, Math.min(count() - 1, moves[e.key])), true);
      }
    });
  }

  // ---------------------------------------------------------------- model view

  let grid = null; // {section, thumbs: [[button]], drawn: scale the thumbnails were drawn with}

  function buildGrid() {
    const s = sec();
    const d = dims(s);
    const box = $('ak-grid');
    box.textContent = '';
    box.style.gridTemplateColumns = 'auto repeat(' + d.h + ', auto)';
    const side = d.h > 12 ? 48 : THUMB;
    const corner = document.createElement('span');
    box.appendChild(corner);
    for (const head of s.heads) {
      const label = document.createElement('span');
      label.className = 'ak-grid-label';
      label.textContent = 'head ' + head;
      box.appendChild(label);
    }
    const thumbs = [];
    s.layers.forEach((layer, li) => {
      const label = document.createElement('span');
      label.className = 'ak-grid-label';
      label.textContent = layerName(s, li);
      box.appendChild(label);
      thumbs.push(s.heads.map((head, hi) => {
        const button = document.createElement('button');
        button.type = 'button';
        button.className = 'ak-thumb';
        button.dataset.layer = String(li);
        button.dataset.head = String(hi);
        button.setAttribute('aria-label', 'layer ' + layer + ', head ' + head + ': open in the matrix view');
        const canvas = document.createElement('canvas');
        canvas.width = Math.min(d.sk, THUMB);
        canvas.height = Math.min(d.sq, THUMB);
        const k = side / Math.max(canvas.width, canvas.height);
        canvas.style.width = Math.round(canvas.width * k) + 'px';
        canvas.style.height = Math.round(canvas.height * k) + 'px';
        button.appendChild(canvas);
        box.appendChild(button);
        return button;
      }));
    });
    grid = { section: state.section, thumbs, drawn: '' };
  }

  // Shrink one map to its thumbnail, keeping each block's largest intensity so that thin
  // patterns (a diagonal, one column) survive the shrinking.
  function drawThumb(canvas, q16, offset, d, s, li, unit) {
    const tw = canvas.width;
    const th = canvas.height;
    const values = intensities(q16, offset, d.sq, d.sk, unit);
    const pooled = new Float32Array(tw * th);
    const colBlock = new Int32Array(d.sk);
    for (let j = 0; j < d.sk; j++) colBlock[j] = Math.floor((j * tw) / d.sk);
    for (let i = 0; i < d.sq; i++) {
      const r = Math.floor((i * th) / d.sq) * tw;
      for (let j = 0; j < d.sk; j++) {
        const v = values[i * d.sk + j];
        const p = r + colBlock[j];
        if (v > pooled[p]) pooled[p] = v;
      }
    }
    const ctx = canvas.getContext('2d');
    const img = ctx.createImageData(tw, th);
    for (let r = 0; r < th; r++) {
      const firstQuery = Math.ceil((r * d.sq) / th);
      const lastQuery = Math.ceil(((r + 1) * d.sq) / th) - 1;
      for (let c = 0; c < tw; c++) {
        const firstKey = Math.ceil((c * d.sk) / tw);
        const lastKey = Math.ceil(((c + 1) * d.sk) / tw) - 1;
        // Grey when every cell of the block is masked: all later than their query, or all
        // outside the window.
        const w = windowOf(s, li);
        const rgb = (s.causal && firstKey > lastQuery) || (w > 0 && firstQuery - lastKey >= w) ? MASKED : null;
        const n = Math.round(pooled[r * tw + c] * 255) * 3;
        const p = (r * tw + c) * 4;
        img.data[p] = rgb ? rgb[0] : LUT[n];
        img.data[p + 1] = rgb ? rgb[1] : LUT[n + 1];
        img.data[p + 2] = rgb ? rgb[2] : LUT[n + 2];
        img.data[p + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  async function renderModel(gen) {
    const s = sec();
    const d = dims(s);
    grid.thumbs.flat().forEach((b) => b.classList.toggle('ak-current',
      Number(b.dataset.layer) === state.layer && Number(b.dataset.head) === state.head));
    if (grid.drawn === state.scale) return;
    for (let li = 0; li < d.L; li++) {
      const q16 = await layerData(li);
      if (gen !== generation) return;
      for (let h = 0; h < d.h; h++) {
        drawThumb(grid.thumbs[li][h].firstChild, q16, h * d.sq * d.sk, d, s, li, s.weights.scale);
      }
      // Let the page handle input between layers while a large model is drawn.
      await new Promise((resolve) => setTimeout(resolve, 0));
      if (gen !== generation) return;
    }
    grid.drawn = state.scale;
  }

  // ---------------------------------------------------------------- matrix view

  let matrix = null; // geometry and data of the map on screen, for hovering and keys
  let matrixFitCell = 0; // the cell size that fits the width, CSS px (for the legend's hint)

  // The map itself: one pixel per cell, to be scaled up without smoothing.
  function mapPixels(s, q16, offset, d, unit) {
    const values = intensities(q16, offset, d.sq, d.sk, unit);
    const pixels = document.createElement('canvas');
    pixels.width = d.sk;
    pixels.height = d.sq;
    const pctx = pixels.getContext('2d');
    const img = pctx.createImageData(d.sk, d.sq);
    for (let i = 0; i < d.sq; i++) {
      for (let j = 0; j < d.sk; j++) {
        const p = (i * d.sk + j) * 4;
        if (masked(s, state.layer, i, j)) {
          img.data[p] = MASKED[0]; img.data[p + 1] = MASKED[1]; img.data[p + 2] = MASKED[2];
        } else {
          const n = Math.round(values[i * d.sk + j] * 255) * 3;
          img.data[p] = LUT[n]; img.data[p + 1] = LUT[n + 1]; img.data[p + 2] = LUT[n + 2];
        }
        img.data[p + 3] = 255;
      }
    }
    pctx.putImageData(img, 0, 0);
    return { pixels, values };
  }

  async function renderMatrix(gen) {
    const s = sec();
    const d = dims(s);
    const q16 = await layerData(state.layer);
    if (gen !== generation) return;
    const unit = s.weights.scale;
    const offset = state.head * d.sq * d.sk;
    const { pixels, values } = mapPixels(s, q16, offset, d, unit);
    const canvas = $('ak-matrix');
    const wrap = $('ak-matrix-wrap');
    const ctx = canvas.getContext('2d');
    ctx.font = '12px ui-monospace, "DejaVu Sans Mono", monospace';
    const widest = (tokens) => Math.min(MAX_LABEL, Math.max(...tokens.map((t) => ctx.measureText(shown(t)).width)));
    const labelQ = widest(s.query_tokens) + 10;
    const labelK = widest(s.key_tokens) + 10;
    wrap.classList.toggle('ak-zoomed', state.zoom > 0);
    const avail = Math.max(240, wrap.clientWidth - 8);
    // Fitted cells fill the width exactly, in fractions of a pixel (below one pixel, a pixel
    // of the picture averages the cells it covers). Labels take room only when cells are tall
    // enough to read them.
    const labelled = Math.min(36, (avail - labelQ) / d.sk);
    matrixFitCell = labelled >= 9 ? labelled : Math.min(36, avail / d.sk);
    const cell = state.zoom > 0 ? state.zoom : matrixFitCell;
    const labels = state.zoom > 0 ? cell >= 9 : labelled >= 9;
    const left = labels ? labelQ : 0;
    const top = labels ? labelK : 0;
    matrix = { q16, offset, d, cell, left, top, unit, values, pixels, labels, zoomed: state.zoom > 0, sx: 0, sy: 0 };
    if (state.cursor) {
      state.cursor.i = Math.min(state.cursor.i, d.sq - 1);
      state.cursor.j = Math.min(state.cursor.j, d.sk - 1);
    }
    // Geometry in CSS px, for tools that point at cells.
    canvas.dataset.cell = String(cell);
    canvas.dataset.left = String(left);
    canvas.dataset.top = String(top);
    canvas.setAttribute('aria-label', 'Attention matrix of ' + state.section + ' ' + layerName(s, state.layer) +
      ', head ' + s.heads[state.head] + ': ' + d.sq + ' query rows by ' + d.sk + ' key columns. Use the arrow keys to read cells.');
    const spacer = $('ak-matrix-spacer');
    spacer.style.width = spacer.style.height = '';
    if (matrix.zoomed) {
      // Only the part in view is drawn, on a canvas that stays in view while the spacer
      // around it gives the scroll bars the whole map's size.
      const W = left + d.sk * cell;
      const H = top + d.sq * cell;
      spacer.style.width = W + 'px';
      spacer.style.height = H + 'px';
      const vw = Math.min(W, wrap.clientWidth);
      const vh = Math.min(H, wrap.clientHeight);
      canvas.width = Math.round(vw * dpr);
      canvas.height = Math.round(vh * dpr);
      canvas.style.width = vw + 'px';
      canvas.style.height = vh + 'px';
      matrix.base = null;
    } else {
      const W = left + d.sk * cell;
      const H = top + d.sq * cell;
      // Everything but the cursor goes to an off-screen base, redrawn under each cursor move.
      const base = document.createElement('canvas');
      base.width = Math.round(W * dpr);
      base.height = Math.round(H * dpr);
      drawMatrixRegion(base.getContext('2d'), W, H, 0, 0);
      canvas.width = base.width;
      canvas.height = base.height;
      canvas.style.width = W + 'px';
      canvas.style.height = H + 'px';
      matrix.base = base;
    }
    if (state.cursor && matrix.zoomed) scrollToCursor();
    paintMatrix();
    drawLegend();
    if (document.activeElement === canvas && state.cursor) showCursorTip();
  }

  // Draw the map on ctx (a W x H CSS px area) as seen with the map scrolled by (sx, sy):
  // labels stay at the left and top edges, cells scroll under them.
  function drawMatrixRegion(ctx, W, H, sx, sy) {
    const s = sec();
    const { d, cell, left, top, pixels, values, q16, offset, unit } = matrix;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = '#ffffff';
    ctx.fillRect(0, 0, W, H);
    // Cells under a pixel are averaged into it; larger ones are drawn sharp.
    ctx.imageSmoothingEnabled = cell < 1;
    const i0 = Math.floor(sy / cell);
    const j0 = Math.floor(sx / cell);
    const i1 = Math.min(d.sq, Math.ceil((sy + H - top) / cell) + 1);
    const j1 = Math.min(d.sk, Math.ceil((sx + W - left) / cell) + 1);
    if (i1 <= i0 || j1 <= j0) return;
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, top, W - left, H - top);
    ctx.clip();
    ctx.drawImage(pixels, j0, i0, j1 - j0, i1 - i0, left + j0 * cell - sx, top + i0 * cell - sy,
      (j1 - j0) * cell, (i1 - i0) * cell);
    if (cell >= 30) {
      // Values written in the cells, as in the PNG heatmaps.
      ctx.font = '11px system-ui, "DejaVu Sans", sans-serif';
      ctx.textAlign = 'center';
      ctx.textBaseline = 'middle';
      for (let i = i0; i < i1; i++) {
        for (let j = j0; j < j1; j++) {
          if (masked(s, state.layer, i, j)) continue;
          ctx.fillStyle = values[i * d.sk + j] > 0.55 ? '#ffffff' : '#1b1f24';
          ctx.fillText((q16[offset + i * d.sk + j] * unit).toFixed(2), left + j * cell + cell / 2 - sx,
            top + i * cell + cell / 2 - sy);
        }
      }
    }
    ctx.restore();
    if (!matrix.labels) return;
    const size = Math.min(12, cell - 1);
    ctx.font = size + 'px ui-monospace, "DejaVu Sans Mono", monospace';
    ctx.fillStyle = '#1b1f24';
    ctx.textBaseline = 'middle';
    ctx.save();
    ctx.beginPath();
    ctx.rect(0, top, left, H - top);
    ctx.clip();
    ctx.textAlign = 'right';
    for (let i = i0; i < i1; i++) ctx.fillText(shown(s.query_tokens[i]), left - 5, top + i * cell + cell / 2 - sy, MAX_LABEL);
    ctx.restore();
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, 0, W - left, top);
    ctx.clip();
    ctx.textAlign = 'left';
    for (let j = j0; j < j1; j++) {
      ctx.save();
      ctx.translate(left + j * cell + cell / 2 - sx, top - 5);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(shown(s.key_tokens[j]), 0, 0, MAX_LABEL);
      ctx.restore();
    }
    ctx.restore();
  }

  function paintMatrix() {
    const canvas = $('ak-matrix');
    const ctx = canvas.getContext('2d');
    if (matrix.zoomed) {
      const wrap = $('ak-matrix-wrap');
      matrix.sx = wrap.scrollLeft;
      matrix.sy = wrap.scrollTop;
      drawMatrixRegion(ctx, canvas.width / dpr, canvas.height / dpr, matrix.sx, matrix.sy);
    } else {
      ctx.setTransform(1, 0, 0, 1, 0, 0);
      ctx.drawImage(matrix.base, 0, 0);
    }
    if (state.cursor) {
      const { cell, left, top, sx, sy } = matrix;
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.lineWidth = 2;
      ctx.strokeStyle = '#d9480f';
      const pad = Math.max(2, cell / 2);
      ctx.strokeRect(left + state.cursor.j * cell - pad / 2 - sx, top + state.cursor.i * cell - pad / 2 - sy,
        cell + pad, cell + pad);
    }
  }

  // What one cell of a map says: its tokens, its value and whether it is masked.
  function describeCell(s, li, q16, offset, i, j) {
    const d = dims(s);
    const w = q16[offset + i * d.sk + j] * s.weights.scale;
    const win = windowOf(s, li);
    return {
      query: shown(s.query_tokens[i]) + '  #' + i + turnNote(turnsOf(s), i),
      key: shown(s.key_tokens[j]) + '  #' + j + turnNote(turnsOf(s), j),
      weight: w.toFixed(5),
      note: s.causal && j > i ? '(masked)' : win > 0 && i - j >= win ? '(masked) outside the window of ' + win : '',
    };
  }

  function showTip(c, x, y, where) {
    const tip = $('ak-tooltip');
    tip.querySelector('.ak-tt-query').textContent = c.query;
    tip.querySelector('.ak-tt-key').textContent = c.key;
    tip.querySelector('.ak-tt-quantity').textContent = quantity().short;
    tip.querySelector('.ak-tt-weight').textContent = c.weight;
    tip.querySelector('.ak-tt-note').textContent = c.note;
    const whereLine = tip.querySelector('.ak-tt-where');
    whereLine.textContent = where || '';
    whereLine.hidden = !where;
    tip.hidden = false;
    const w = tip.offsetWidth;
    const h = tip.offsetHeight;
    tip.style.left = Math.max(4, Math.min(x + 14, window.innerWidth - w - 4)) + 'px';
    tip.style.top = Math.max(4, y + 14 + h > window.innerHeight ? y - h - 10 : y + 14) + 'px';
    return c;
  }

  function showMatrixTip(i, j, x, y) {
    const c = describeCell(sec(), state.layer, matrix.q16, matrix.offset, i, j);
    const tip = $('ak-tooltip');
    tip.dataset.i = String(i);
    tip.dataset.j = String(j);
    return showTip(c, x, y, '');
  }

  function hideTip() {
    $('ak-tooltip').hidden = true;
  }

  function cellAt(e) {
    const rect = $('ak-matrix').getBoundingClientRect();
    const x = e.clientX - rect.left - matrix.left;
    const y = e.clientY - rect.top - matrix.top;
    if (x < 0 || y < 0) return null;
    const j = Math.floor((x + matrix.sx) / matrix.cell);
    const i = Math.floor((y + matrix.sy) / matrix.cell);
    return i < matrix.d.sq && j < matrix.d.sk ? { i, j } : null;
  }

  // Keep the cursor's cell in view of a zoomed map.
  function scrollToCursor() {
    if (!matrix.zoomed) return;
    const wrap = $('ak-matrix-wrap');
    const { cell, left, top } = matrix;
    const { i, j } = state.cursor;
    const viewW = wrap.clientWidth - left;
    const viewH = wrap.clientHeight - top;
    if (j * cell < wrap.scrollLeft) wrap.scrollLeft = j * cell;
    else if ((j + 1) * cell > wrap.scrollLeft + viewW) wrap.scrollLeft = (j + 1) * cell - viewW;
    if (i * cell < wrap.scrollTop) wrap.scrollTop = i * cell;
    else if ((i + 1) * cell > wrap.scrollTop + viewH) wrap.scrollTop = (i + 1) * cell - viewH;
  }

  function showCursorTip() {
    const rect = $('ak-matrix').getBoundingClientRect();
    const { i, j } = state.cursor;
    const c = showMatrixTip(i, j, rect.left + matrix.left + (j + 1) * matrix.cell - matrix.sx,
      rect.top + matrix.top + (i + 1) * matrix.cell - matrix.sy);
    $('ak-matrix-live').textContent = 'query ' + c.query + ', key ' + c.key + ', ' + quantity().short + ' ' + c.weight +
      ' ' + c.note;
  }

  // Model view: the tooltip of a thumbnail names the strongest cell of the block under the
  // pointer (each thumbnail pixel keeps its block's largest value).
  function thumbTip(e) {
    const canvas = e.target.closest('.ak-thumb canvas');
    if (!canvas) { hideTip(); return; }
    const button = canvas.parentElement;
    const s = sec();
    const d = dims(s);
    const li = Number(button.dataset.layer);
    const h = Number(button.dataset.head);
    const q16 = resolved.get(state.section + '/' + li);
    const where = 'layer ' + s.layers[li] + ', head ' + s.heads[h] + (s.windows ? ', ' + layerKind(s, li) : '');
    if (!q16) { hideTip(); return; }
    const rect = canvas.getBoundingClientRect();
    const r = Math.min(canvas.height - 1, Math.floor(((e.clientY - rect.top) / rect.height) * canvas.height));
    const c = Math.min(canvas.width - 1, Math.floor(((e.clientX - rect.left) / rect.width) * canvas.width));
    const offset = h * d.sq * d.sk;
    let best = null;
    for (let i = Math.ceil((r * d.sq) / canvas.height); i < Math.ceil(((r + 1) * d.sq) / canvas.height); i++) {
      for (let j = Math.ceil((c * d.sk) / canvas.width); j < Math.ceil(((c + 1) * d.sk) / canvas.width); j++) {
        const q = q16[offset + i * d.sk + j];
        if (!best || q > best.q) best = { i, j, q };
      }
    }
    if (!best) { hideTip(); return; }
    showTip(describeCell(s, li, q16, offset, best.i, best.j), e.clientX, e.clientY, where);
  }

  function matrixEvents() {
    const canvas = $('ak-matrix');
    canvas.addEventListener('mousemove', (e) => {
      if (!matrix) return;
      const cell = cellAt(e);
      if (cell) showMatrixTip(cell.i, cell.j, e.clientX, e.clientY);
      else hideTip();
    });
    canvas.addEventListener('mouseleave', hideTip);
    $('ak-matrix-wrap').addEventListener('scroll', () => {
      if (matrix && matrix.zoomed) requestAnimationFrame(() => { if (matrix && matrix.zoomed) paintMatrix(); });
    }, { passive: true });
    canvas.addEventListener('focus', () => {
      if (!matrix) return;
      if (!state.cursor) state.cursor = { i: 0, j: 0 };
      paintMatrix();
      showCursorTip();
    });
    canvas.addEventListener('blur', () => {
      state.cursor = null;
      hideTip();
      if (matrix) paintMatrix();
    });
    canvas.addEventListener('keydown', (e) => {
      if (!matrix || !state.cursor) return;
      const { i, j } = state.cursor;
      const moves = {
        ArrowDown: [i + 1, j], ArrowUp: [i - 1, j], ArrowRight: [i, j + 1], ArrowLeft: [i, j - 1],
        PageDown: [i + 10, j], PageUp: [i - 10, j], Home: [i, 0], End: [i, matrix.d.sk - 1],
      };
      if (e.key === 'Escape') {
        hideTip();
        return;
      }
      if (!(e.key in moves)) return;
      e.preventDefault();
      const [ni, nj] = moves[e.key];
      state.cursor = { i: Math.max(0, Math.min(matrix.d.sq - 1, ni)), j: Math.max(0, Math.min(matrix.d.sk - 1, nj)) };
      scrollToCursor();
      paintMatrix();
      showCursorTip();
    });
  }

  // ---------------------------------------------------------------- rank view

  function fillRankPickers() {
    const s = sec();
    const q = $('ak-rank-q');
    const k = $('ak-rank-k');
    q.textContent = '';
    k.textContent = '';
    s.query_tokens.forEach((t, n) => q.add(new Option('#' + n + ' ' + shown(t), String(n))));
    k.add(new Option('any: each map\u2019s strongest key', '-1'));
    s.key_tokens.forEach((t, n) => k.add(new Option('#' + n + ' ' + shown(t), String(n))));
    q.value = String(state.rankQ !== null ? state.rankQ : state.pinnedQ >= 0 ? state.pinnedQ : s.query_tokens.length - 1);
    k.value = String(state.rankK !== null ? state.rankK : state.pinnedK >= 0 ? state.pinnedK : -1);
  }

  // Every map of the section (layer x head), ranked by the weight from the chosen query to
  // the chosen key (or to the key it attends to most).
  async function renderRank(gen) {
    const s = sec();
    const d = dims(s);
    const qi = Number($('ak-rank-q').value);
    const kj = Number($('ak-rank-k').value);
    const merged = state.section === 'rollout';
    const found = [];
    for (let li = 0; li < d.L; li++) {
      const q16 = await layerData(li);
      if (gen !== generation) return;
      for (let h = 0; h < d.h; h++) {
        const row = (h * d.sq + qi) * d.sk;
        let j = kj;
        if (j < 0) {
          j = 0;
          for (let n = 1; n < d.sk; n++) if (q16[row + n] > q16[row + j]) j = n;
        }
        found.push({ li, h, j, q: q16[row + j] });
      }
    }
    found.sort((a, b) => b.q - a.q || a.li - b.li || a.h - b.h);
    const tbody = $('ak-rank-rows');
    tbody.textContent = '';
    found.slice(0, RANK_ROWS).forEach((r, n) => {
      const tr = document.createElement('tr');
      const rank = document.createElement('td');
      rank.textContent = String(n + 1);
      const where = document.createElement('td');
      const button = document.createElement('button');
      button.type = 'button';
      button.className = 'ak-rank-open';
      button.dataset.layer = String(r.li);
      button.dataset.head = String(r.h);
      button.dataset.key = String(r.j);
      button.textContent = (merged ? layerName(s, r.li) : layerName(s, r.li) + ', head ' + s.heads[r.h]);
      button.setAttribute('aria-label', button.textContent + ': open in the matrix view');
      where.appendChild(button);
      const key = document.createElement('td');
      const keyText = document.createElement('span');
      keyText.className = 'ak-token-text';
      keyText.textContent = shown(s.key_tokens[r.j]);
      key.append(keyText, ' #' + r.j);
      const value = document.createElement('td');
      value.textContent = (r.q * s.weights.scale).toFixed(4);
      tr.append(rank, where, key, value);
      tbody.appendChild(tr);
    });
    $('ak-rank-quantity').textContent = quantity().short;
    const from = '\u201c' + shown(s.query_tokens[qi]) + '\u201d #' + qi;
    const to = kj < 0 ? 'its strongest key' : '\u201c' + shown(s.key_tokens[kj]) + '\u201d #' + kj;
    const count = (n, word) => n + ' ' + word + (n === 1 ? '' : 's');
    const maps = merged ? count(d.L, 'layer') : count(d.L, 'layer') + ' \u00d7 ' + count(d.h, 'head');
    let note = 'From ' + from + ' to ' + to + ': ' + maps + ', ' +
      (found.length > RANK_ROWS ? 'the strongest ' + RANK_ROWS + ' listed.' : 'all listed.');
    const m = info && info.models.find((x) => x.name === state.data.model);
    const stack = state.section === 'decoder' || state.section === 'cross' ? (m && m.decoder_layers) : (m && m.layers);
    if (m && stack > d.L) {
      note += ' Only ' + d.L + ' of the model\u2019s ' + stack + ' layers were computed: choose more in Layers to ' +
        'compute and Show attention again to rank them too.';
    }
    $('ak-rank-note').textContent = note;
  }

  function openRanked(button) {
    const li = Number(button.dataset.layer);
    const h = Number(button.dataset.head);
    state.layer = li;
    state.head = h;
    $('ak-layer').value = String(li);
    $('ak-head').value = String(h);
    state.cursor = { i: Number($('ak-rank-q').value), j: Number(button.dataset.key) };
    setView('matrix', false);
    $('ak-matrix').focus({ preventScroll: true });
  }

  // ---------------------------------------------------------------- long view

  // A long text's attention without its [s, s] map: each head's block-reduced map (the max
  // and the mean of the weights in B x B blocks of query and key tokens), every query's
  // strongest keys and each head's summary, from an exported page (format
  // "attnkit-viewer-long", docs/long-contexts.md) or from POST api/long/map. In the app,
  // selected blocks are replaced by their exact weights from POST api/long/block, computed
  // by the model for that region only; Zoom out goes back to the reduced map.
  const LONG_MAX_CELL = 24; // long view: largest cell side, CSS px
  const LONG_MIN_HEIGHT = 36; // long view: a zoom into a few rows is drawn at least this tall, CSS px
  const LONG_TOP_K = 8; // long view in the app: keys listed per query
  const LONG_WINDOW = 256; // long view in the app: distance counted as near in the summaries

  // {model, causal, tokens, block, k, n, window, layers: [{layer, window, heads: [{head, summary, get}]}],
  //  app: null or {text, model, maxWeights}, zoom, sel, query, current}
  let long = null;
  let longMap = null; // what the long map shows: {rows, cols, cw, ch, values, pixels}
  let longDrag = null; // cells from the one pressed to the one under the pointer: {i0, j0, i1, j1}
  let longCursor = null; // the keyboard's cell {i, j} while the map has the focus
  let longPointer = null; // where the pointer is over the long map {clientX, clientY}, else null

  // One head of an exported page, decoded: its maps as weights, its top keys and weights.
  async function decodeLongHead(json, entry, what) {
    const n = Math.ceil(json.tokens.length / json.block);
    const map = async (m) => Float32Array.from(uint16s(await inflate(m.data), n * n, what + ' map'), (q) => q * m.scale);
    const count = json.tokens.length * json.top_k;
    const keyBytes = await inflate(entry.top_keys);
    if (keyBytes.length !== 4 * count) {
      throw new Error(what + ' top keys: expected ' + 4 * count + ' bytes, got ' + keyBytes.length);
    }
    const topKeys = new Int32Array(count);
    for (let x = 0; x < count; x++) {
      topKeys[x] = keyBytes[4 * x] | (keyBytes[4 * x + 1] << 8) | (keyBytes[4 * x + 2] << 16) | (keyBytes[4 * x + 3] << 24);
    }
    const topWeights = Float32Array.from(uint16s(await inflate(entry.top_weights), count, what + ' top weights'),
      (q) => q / 65535);
    return { max: await map(entry.max), mean: await map(entry.mean), topKeys, topWeights };
  }

  function longFromPage(json) {
    if (json.version !== 1) throw new Error('this long view is version ' + json.version + '; this viewer reads version 1');
    return {
      model: json.model, causal: json.causal, tokens: json.tokens, block: json.block, k: json.top_k,
      n: Math.ceil(json.tokens.length / json.block), window: json.window, app: null,
      layers: json.layers.map((l) => ({
        layer: l.layer,
        window: l.sliding_window || 0,
        heads: l.heads.map((h) => {
          let decodedHead = null;
          const get = () => (decodedHead = decodedHead || decodeLongHead(json, h, 'layer ' + l.layer + ' head ' + h.head));
          return { head: h.head, summary: h.summary, get };
        }),
      })),
    };
  }

  // The answer of POST api/long/map (one layer and head) as a long view.
  function longFromApp(json, request) {
    const head = {
      max: Float32Array.from(json.max.flat()), mean: Float32Array.from(json.mean.flat()),
      topKeys: Int32Array.from(json.top_k_keys.flat()), topWeights: Float32Array.from(json.top_k_weights.flat()),
    };
    return {
      model: json.model, causal: json.causal, tokens: json.tokens, block: json.block, k: request.top_k,
      n: json.max.length, window: request.window,
      app: { text: request.text, model: json.model, level: request.level, maxWeights: json.max_block_weights },
      layers: [{ layer: json.layer, window: json.sliding_window || 0,
        heads: [{ head: json.head, summary: json.summary, get: () => Promise.resolve(head) }] }],
    };
  }

  function loadLong(data) {
    state.data = null;
    long = Object.assign(data, { zoom: null, sel: null, query: -1, current: null });
    longMap = null;
    longDrag = null;
    const unit = long.tokens.length + ' tokens';
    $('ak-summary').textContent = modelLabel(long.model) + ' \u00b7 ' + (long.causal ? 'causal' : 'bidirectional') +
      ' self-attention \u00b7 ' + unit + ' \u00b7 blocks of ' + long.block + ' \u00d7 ' + long.block + ' tokens';
    $('ak-text-shown').textContent = '';
    document.title = 'Long-context attention: ' + modelLabel(long.model);
    $('ak-title').textContent = document.title;
    $('ak-error').hidden = true;
    $('ak-main').hidden = false;
    $('ak-long-hint').textContent = 'Rows are query tokens (attending), columns key tokens (attended to), ' +
      long.block + ' of each per cell: a cell is the largest or the mean weight of its block, exact, computed ' +
      'without the whole map. Hover a cell to read it; click it to list the strongest keys of the query that ' +
      'attends to it most. ' + (long.app
      ? 'Drag across blocks, or click one and choose Exact weights, to replace them with their exact weights ' +
        'computed by the model; Zoom out goes back.'
      : 'For exact weights of any region, open the text in attnkit serve with Long text on.');
    const layerSelect = $('ak-layer');
    layerSelect.textContent = '';
    long.layers.forEach((l, n) =>
      layerSelect.add(new Option('layer ' + l.layer + (l.window ? ' \u00b7 local (' + l.window + ')' : ''), String(n))));
    state.layer = 0;
    state.head = 0;
    layerSelect.value = '0';
    fillSelect($('ak-head'), long.layers[0].heads.map((h) => h.head), 'head', 0);
    state.scale = 'sqrt';
    $('ak-scale').value = state.scale;
    $('ak-scale').options[0].text = WEIGHT.scaleLabel;
    $('ak-axes').hidden = true;
    setView('long', false);
  }

  // Back to the reduced map of another head (and, for another layer, its first head).
  function longReset(layerChanged) {
    long.zoom = null;
    long.sel = null;
    if (layerChanged) {
      state.head = 0;
      fillSelect($('ak-head'), long.layers[state.layer].heads.map((h) => h.head), 'head', 0);
    }
  }

  function longLegendNote() {
    if (long.zoom) return 'Exact weights of the zoomed region.';
    return state.reduce === 'mean'
      ? 'Mean weight of each block, the map scaled so that its largest block mean is 1.'
      : 'Largest weight of each block: a single strong key shows even when the block\u2019s mean is tiny.';
  }

  // Whether every query and key a cell of the long map covers is masked: later keys
  // (causal) or keys outside a local layer's window.
  function longMasked(i, j) {
    const r = longRegion(i, i, j, j);
    const w = long.layers[state.layer].window;
    const q0 = r.r0;
    const q1 = r.r1 - 1;
    const k0 = r.k0;
    const k1 = r.k1 - 1;
    return (long.causal && k0 > q1) || (w > 0 && q0 - k1 >= w) || (w > 0 && !long.causal && k0 - q1 >= w);
  }

  // The query and key tokens [start, stop) that cells i0..i1 x j0..j1 of the long map cover.
  function longRegion(i0, i1, j0, j1) {
    const z = long.zoom;
    if (z) return { r0: z.r0 + i0, r1: z.r0 + i1 + 1, k0: z.k0 + j0, k1: z.k0 + j1 + 1 };
    const s = long.tokens.length;
    const b = long.block;
    return { r0: i0 * b, r1: Math.min(s, (i1 + 1) * b), k0: j0 * b, k1: Math.min(s, (j1 + 1) * b) };
  }

  async function renderLong(gen) {
    const layer = long.layers[state.layer];
    const head = await layer.heads[state.head].get();
    if (gen !== generation) return;
    long.current = head;
    fillLongHeads(layer);
    fillLongTop();
    const z = long.zoom;
    const values = z ? z.weights : state.reduce === 'mean' ? head.mean : head.max;
    const rows = z ? z.r1 - z.r0 : long.n;
    const cols = z ? z.k1 - z.k0 : long.n;
    let largest = 0;
    for (const v of values) if (v > largest) largest = v;
    const unit = !z && state.reduce === 'mean' && largest > 0 ? 1 / largest : 1;
    const shades = intensities(values, 0, rows, cols, unit);
    const pixels = document.createElement('canvas');
    pixels.width = cols;
    pixels.height = rows;
    const pctx = pixels.getContext('2d');
    const img = pctx.createImageData(cols, rows);
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        const p = (i * cols + j) * 4;
        const n = Math.round(Math.min(1, shades[i * cols + j]) * 255) * 3;
        const rgb = longMasked(i, j) ? MASKED : [LUT[n], LUT[n + 1], LUT[n + 2]];
        img.data[p] = rgb[0];
        img.data[p + 1] = rgb[1];
        img.data[p + 2] = rgb[2];
        img.data[p + 3] = 255;
      }
    }
    pctx.putImageData(img, 0, 0);
    // Cells of single tokens (a zoom, or blocks of one token) are labelled with their tokens
    // when they are tall enough to read.
    const ctx = $('ak-long-map').getContext('2d');
    ctx.font = '12px ui-monospace, "DejaVu Sans Mono", monospace';
    const r = longRegion(0, rows - 1, 0, cols - 1);
    const single = Boolean(z) || long.block === 1;
    const widest = (a, b) => Math.min(MAX_LABEL,
      Math.max(0, ...long.tokens.slice(a, b).map((t) => ctx.measureText(shown(t)).width))) + 10;
    const labelQ = single ? widest(r.r0, r.r1) : 0;
    const labelK = single ? widest(r.k0, r.k1) : 0;
    // A zoom takes the whole width (the tables go below it) and may be taller than the window:
    // it is for reading tokens. The block map fits the window's height too.
    document.querySelector('.ak-long').classList.toggle('ak-long-zoomed', Boolean(z));
    const avail = Math.max(240, $('ak-long-wrap').clientWidth - 8);
    const tall = z ? Infinity : Math.max(240, window.innerHeight - 60);
    const fit = (w, h) => Math.max(1, Math.min(LONG_MAX_CELL, Math.floor(w / cols), Math.floor(h / rows)));
    const labels = single && fit(avail - labelQ, tall - labelK) >= 9;
    const cw = labels ? fit(avail - labelQ, tall - labelK) : fit(avail, tall);
    const ch = Math.max(cw, Math.min(LONG_MAX_CELL, Math.floor(LONG_MIN_HEIGHT / rows)));
    const left = labels ? labelQ : 0;
    const top = labels ? labelK : 0;
    longMap = { rows, cols, cw, ch, values, pixels, left, top, r0: r.r0, k0: r.k0, labels };
    if (longCursor) longCursor = { i: Math.min(longCursor.i, rows - 1), j: Math.min(longCursor.j, cols - 1) };
    const canvas = $('ak-long-map');
    canvas.width = Math.round((left + cols * cw) * dpr);
    canvas.height = Math.round((top + rows * ch) * dpr);
    canvas.style.width = left + cols * cw + 'px';
    canvas.style.height = top + rows * ch + 'px';
    // Geometry and what is shown, for tools that point at cells (cells start at left, top).
    Object.assign(canvas.dataset, { cellWidth: String(cw), cellHeight: String(ch), rows: String(rows),
      cols: String(cols), shows: z ? 'exact' : state.reduce, left: String(left), top: String(top) });
    canvas.setAttribute('aria-label', (z ? 'Exact attention weights' : 'Block-reduced attention map (' + state.reduce +
      ')') + ' of layer ' + layer.layer + ', head ' + layer.heads[state.head].head + ': queries ' + r.r0 + ' to ' +
      (r.r1 - 1) + ' down, keys ' + r.k0 + ' to ' + (r.k1 - 1) + ' across.');
    paintLong();
    longBar();
    drawLegend();
    // A tooltip shown before the map changed under the pointer now reads the new map.
    if (longPointer && !$('ak-tooltip').hidden) {
      const c = longCellAt(longPointer);
      if (c) longTip(c.i, c.j, longPointer.clientX, longPointer.clientY);
      else hideTip();
    }
  }

  function paintLong() {
    const ctx = $('ak-long-map').getContext('2d');
    const { rows, cols, cw, ch, pixels, left, top } = longMap;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = '#ffffff';
    ctx.fillRect(0, 0, left + cols * cw, top + rows * ch);
    if (longMap.labels) paintLongLabels(ctx);
    ctx.translate(left, top);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(pixels, 0, 0, cols * cw, rows * ch);
    // The selected query's row, then the selection.
    const z = long.zoom;
    const row = long.query < 0 ? -1 : z ? long.query - z.r0 : Math.floor(long.query / long.block);
    ctx.lineWidth = 2;
    if (row >= 0 && row < rows) {
      ctx.strokeStyle = '#c88a00';
      ctx.strokeRect(0, row * ch, cols * cw, ch);
    }
    const box = longDrag ? longBox(longDrag) : long.sel;
    if (box) {
      ctx.strokeStyle = '#d9480f';
      ctx.strokeRect(box.j0 * cw, box.i0 * ch, (box.j1 - box.j0 + 1) * cw, (box.i1 - box.i0 + 1) * ch);
    }
    if (longCursor) {
      ctx.strokeStyle = '#1b1f24';
      const pad = Math.max(2, cw / 2);
      ctx.strokeRect(longCursor.j * cw - pad / 2, longCursor.i * ch - pad / 2, cw + pad, ch + pad);
    }
  }

  // The query tokens left of the rows and the key tokens above the columns of a labelled map.
  function paintLongLabels(ctx) {
    const { rows, cols, cw, ch, left, top, r0, k0 } = longMap;
    ctx.font = Math.min(12, ch - 1) + 'px ui-monospace, "DejaVu Sans Mono", monospace';
    ctx.fillStyle = '#1b1f24';
    ctx.textBaseline = 'middle';
    ctx.textAlign = 'right';
    for (let i = 0; i < rows; i++) ctx.fillText(shown(long.tokens[r0 + i]), left - 5, top + i * ch + ch / 2, MAX_LABEL);
    ctx.textAlign = 'left';
    for (let j = 0; j < cols; j++) {
      ctx.save();
      ctx.translate(left + j * cw + cw / 2, top - 5);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(shown(long.tokens[k0 + j]), 0, 0, MAX_LABEL);
      ctx.restore();
    }
  }

  // Keys on the focused map: arrows (Page Up/Down, Home/End) move a cursor whose cell the
  // tooltip reads; Enter or Space clicks it.
  function longKey(e) {
    if (!longMap || !longCursor) return;
    const { i, j } = longCursor;
    const moves = {
      ArrowDown: [i + 1, j], ArrowUp: [i - 1, j], ArrowRight: [i, j + 1], ArrowLeft: [i, j - 1],
      PageDown: [i + 10, j], PageUp: [i - 10, j], Home: [i, 0], End: [i, longMap.cols - 1],
    };
    if (e.key === 'Enter' || e.key === ' ') {
      e.preventDefault();
      selectLongCell(i, j);
    } else if (e.key in moves) {
      e.preventDefault();
      const [ni, nj] = moves[e.key];
      longCursor = { i: Math.max(0, Math.min(longMap.rows - 1, ni)), j: Math.max(0, Math.min(longMap.cols - 1, nj)) };
      paintLong();
      longCursorTip();
    } else if (e.key === 'Escape') {
      hideTip();
    }
  }

  function longCursorTip() {
    const rect = $('ak-long-map').getBoundingClientRect();
    const { i, j } = longCursor;
    longTip(i, j, rect.left + longMap.left + (j + 1) * longMap.cw, rect.top + longMap.top + (i + 1) * longMap.ch);
    const tip = $('ak-tooltip');
    $('ak-long-live').textContent = 'query ' + tip.querySelector('.ak-tt-query').textContent + ', key ' +
      tip.querySelector('.ak-tt-key').textContent + ', weight ' + tip.querySelector('.ak-tt-weight').textContent;
  }

  // A drag's cells as a box with i0 <= i1 and j0 <= j1.
  const longBox = (d) => ({ i0: Math.min(d.i0, d.i1), i1: Math.max(d.i0, d.i1), j0: Math.min(d.j0, d.j1),
    j1: Math.max(d.j0, d.j1) });

  function fillLongHeads(layer) {
    $('ak-long-heads-caption').textContent = 'Heads of layer ' + layer.layer + (layer.window
      ? ' (local, window ' + layer.window + ')' : '') + ', averaged over the queries';
    $('ak-long-window-col').textContent = 'within ' + long.window;
    const rows = $('ak-long-head-rows');
    rows.textContent = '';
    layer.heads.forEach((h, n) => {
      const tr = document.createElement('tr');
      tr.dataset.head = String(n);
      tr.classList.toggle('ak-current', n === state.head);
      const t = h.summary;
      for (const v of ['head ' + h.head, t.sink.toFixed(3), t.distance.toFixed(1), String(t.distance_q50),
        t.within_window.toFixed(3), t.entropy.toFixed(2)]) {
        const td = document.createElement('td');
        td.textContent = v;
        tr.appendChild(td);
      }
      rows.appendChild(tr);
    });
  }

  // The strongest keys of the selected query, as the summaries found them over every key.
  function fillLongTop() {
    const rows = $('ak-long-top-rows');
    rows.textContent = '';
    const q = long.query;
    if (q < 0 || !long.current) {
      $('ak-long-query').textContent = 'Click the map to list a query\u2019s strongest keys.';
      return;
    }
    $('ak-long-query').textContent = 'Strongest keys of query \u201c' + shown(long.tokens[q]) + '\u201d #' + q +
      ', over all ' + (long.causal ? q + 1 : long.tokens.length) + ' keys it may attend to';
    for (let n = 0; n < long.k; n++) {
      const key = long.current.topKeys[q * long.k + n];
      if (key < 0) continue;
      const tr = document.createElement('tr');
      const token = document.createElement('span');
      token.className = 'ak-token-text';
      token.textContent = shown(long.tokens[key]);
      const cells = [String(n + 1), null, long.current.topWeights[q * long.k + n].toFixed(4),
        String(long.causal ? q - key : Math.abs(q - key))];
      for (const v of cells) {
        const td = document.createElement('td');
        if (v === null) td.append(token, ' #' + key);
        else td.textContent = v;
        tr.appendChild(td);
      }
      rows.appendChild(tr);
    }
  }

  // What the map shows and the zoom buttons that apply.
  function longBar() {
    const z = long.zoom;
    let where = 'Each cell: the ' + (state.reduce === 'mean' ? 'mean' : 'largest') + ' weight of ' + long.block +
      ' \u00d7 ' + long.block + ' query and key tokens.';
    if (z) {
      where = 'Exact weights of queries #' + z.r0 + '\u2013' + (z.r1 - 1) + ' and keys #' + z.k0 + '\u2013' + (z.k1 - 1) +
        ', each row normalised over all its keys.';
    } else if (long.sel) {
      const r = longRegion(long.sel.i0, long.sel.i1, long.sel.j0, long.sel.j1);
      where = 'Selected: queries #' + r.r0 + '\u2013' + (r.r1 - 1) + ', keys #' + r.k0 + '\u2013' + (r.k1 - 1) + '.';
    }
    $('ak-long-where').textContent = where;
    $('ak-long-out').hidden = !z;
    $('ak-long-zoom').hidden = !(long.app && !z && long.sel);
    $('ak-long-row').hidden = !(long.app && long.query >= 0);
  }

  function longCellAt(e) {
    const rect = $('ak-long-map').getBoundingClientRect();
    const j = Math.floor((e.clientX - rect.left - longMap.left) / longMap.cw);
    const i = Math.floor((e.clientY - rect.top - longMap.top) / longMap.ch);
    return i >= 0 && j >= 0 && i < longMap.rows && j < longMap.cols ? { i, j } : null;
  }

  function longTip(i, j, x, y) {
    const r = longRegion(i, i, j, j);
    const tokens = (a, b) => (b - a === 1 ? shown(long.tokens[a]) + '  #' + a
      : '#' + a + '\u2013' + (b - 1) + ' (\u201c' + shown(long.tokens[a]) + '\u201d\u2026)');
    const note = longMasked(i, j) ? '(masked)' : long.zoom ? '(exact)'
      : state.reduce === 'mean' ? '(mean of the block)' : '(largest in the block)';
    const tip = $('ak-tooltip');
    tip.dataset.i = String(i);
    tip.dataset.j = String(j);
    showTip({ query: tokens(r.r0, r.r1), key: tokens(r.k0, r.k1), weight: longMap.values[i * longMap.cols + j].toFixed(6),
      note }, x, y, '');
  }

  // A click on one cell: select it, and the query of its rows with the strongest key in its
  // columns (by the top keys; its first query when none of them falls there).
  function selectLongCell(i, j) {
    long.sel = { i0: i, i1: i, j0: j, j1: j };
    const r = longRegion(i, i, j, j);
    let best = r.r0;
    let bestWeight = -1;
    for (let q = r.r0; q < r.r1; q++) {
      for (let n = 0; n < long.k; n++) {
        const key = long.current.topKeys[q * long.k + n];
        const w = long.current.topWeights[q * long.k + n];
        if (key >= r.k0 && key < r.k1 && w > bestWeight) {
          best = q;
          bestWeight = w;
        }
      }
    }
    long.query = best;
    fillLongTop();
    paintLong();
    longBar();
  }

  async function requestJSON(url, payload) {
    const response = await fetch(url, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(payload),
    });
    const json = await response.json().catch(() => null);
    if (response.ok) return json;
    const detail = json && typeof json.detail === 'string' ? json.detail : response.statusText;
    throw new Error('Error ' + response.status + ': ' + detail);
  }

  // Replace the map with the exact weights of queries r0..r1 and keys k0..k1, from the model.
  async function zoomLong(r) {
    const count = (r.r1 - r.r0) * (r.k1 - r.k0);
    if (count > long.app.maxWeights) {
      status('The selection is ' + (r.r1 - r.r0) + ' rows \u00d7 ' + (r.k1 - r.k0) + ' keys = ' + count +
        ' weights, more than this server\u2019s limit of ' + long.app.maxWeights + ' per zoom: select fewer blocks.', true);
      return;
    }
    const asked = long;
    const layer = long.layers[state.layer];
    body.dataset.state = 'loading';
    status('Computing the exact weights of ' + (r.r1 - r.r0) + ' \u00d7 ' + (r.k1 - r.k0) + ' tokens\u2026', false);
    try {
      const json = await requestJSON('api/long/block', { text: long.app.text, model: long.app.model, layer: layer.layer,
        head: layer.heads[state.head].head, rows: [r.r0, r.r1], keys: [r.k0, r.k1], level: long.app.level });
      if (asked !== long) return;
      long.zoom = { r0: r.r0, r1: r.r1, k0: r.k0, k1: r.k1, weights: Float32Array.from(json.weights.flat()) };
      long.sel = null;
      status('Exact weights of queries #' + r.r0 + '\u2013' + (r.r1 - 1) + ' and keys #' + r.k0 + '\u2013' + (r.k1 - 1) +
        '.', false);
      await render();
    } catch (err) {
      status(err && err.message ? err.message : String(err), true);
      body.dataset.state = 'error';
    }
  }

  // The keys the selected query may attend to, for its exact row.
  function longRowKeys(q) {
    const s = long.tokens.length;
    const w = long.layers[state.layer].window;
    const k0 = w > 0 ? Math.max(0, q - w + 1) : 0;
    const k1 = long.causal ? q + 1 : w > 0 ? Math.min(s, q + w) : s;
    return { r0: q, r1: q + 1, k0, k1 };
  }

  function longEvents() {
    const canvas = $('ak-long-map');
    canvas.addEventListener('mousedown', (e) => {
      if (!longMap || e.button !== 0) return;
      const c = longCellAt(e);
      if (!c) return;
      e.preventDefault();
      longDrag = { i0: c.i, j0: c.j, i1: c.i, j1: c.j };
    });
    canvas.addEventListener('mousemove', (e) => {
      longPointer = { clientX: e.clientX, clientY: e.clientY };
      if (!longMap) return;
      const c = longCellAt(e);
      if (!c) { hideTip(); return; }
      if (longDrag && (longDrag.i1 !== c.i || longDrag.j1 !== c.j)) {
        longDrag.i1 = c.i;
        longDrag.j1 = c.j;
        paintLong();
      }
      longTip(c.i, c.j, e.clientX, e.clientY);
    });
    canvas.addEventListener('mouseleave', () => {
      longPointer = null;
      hideTip();
    });
    canvas.addEventListener('focus', () => {
      if (!longMap) return;
      longCursor = long.sel ? { i: long.sel.i0, j: long.sel.j0 } : { i: 0, j: 0 };
      paintLong();
      longCursorTip();
    });
    canvas.addEventListener('blur', () => {
      longCursor = null;
      hideTip();
      if (longMap) paintLong();
    });
    canvas.addEventListener('keydown', longKey);
    window.addEventListener('mouseup', (e) => {
      if (!longDrag) return;
      // Where the button is let go ends the drag, whether or not a move got there first.
      const end = longCellAt(e);
      if (end) Object.assign(longDrag, { i1: end.i, j1: end.j });
      const box = longBox(longDrag);
      longDrag = null;
      if (box.i0 === box.i1 && box.j0 === box.j1) {
        selectLongCell(box.i0, box.j0);
      } else if (long.app && !long.zoom) {
        long.sel = box;
        zoomLong(longRegion(box.i0, box.i1, box.j0, box.j1));
      } else {
        long.sel = box;
        paintLong();
        longBar();
      }
    });
    $('ak-long-zoom').addEventListener('click', () => {
      if (long && long.sel) zoomLong(longRegion(long.sel.i0, long.sel.i1, long.sel.j0, long.sel.j1));
    });
    $('ak-long-row').addEventListener('click', () => {
      if (long && long.query >= 0) zoomLong(longRowKeys(long.query));
    });
    $('ak-long-out').addEventListener('click', () => {
      long.zoom = null;
      long.sel = null;
      status('', false);
      render();
    });
    $('ak-long-head-rows').addEventListener('click', (e) => {
      const tr = e.target.closest('tr[data-head]');
      if (!tr || long.app) return;
      state.head = Number(tr.dataset.head);
      $('ak-head').value = tr.dataset.head;
      longReset(false);
      render();
    });
  }

  // The app's long view: POST api/long/map for one layer and head of the text.
  async function submitLong(text, m) {
    const layerPick = $('ak-req-layer').value;
    const headPick = $('ak-req-head').value;
    const payload = { text, model: m.name, layer: /^\d+$/.test(layerPick) ? Number(layerPick) : m.layers - 1,
      head: headPick === 'all' ? 0 : Number(headPick), window: LONG_WINDOW, top_k: LONG_TOP_K,
      level: $('ak-level').value };
    const button = $('ak-run');
    button.disabled = true;
    body.dataset.state = 'loading';
    status('Computing the block-reduced map\u2026', false);
    const started = performance.now();
    try {
      const json = await requestJSON('api/long/map', payload);
      const seconds = ((performance.now() - started) / 1000).toFixed(2);
      const chosen = /^\d+$/.test(layerPick) && headPick !== 'all';
      status(json.tokens.length + ' tokens, layer ' + json.layer + ' head ' + json.head + ', in ' + seconds + ' s.' +
        (chosen ? '' : ' The long view shows one layer and head: choose them in Layers and Heads to compute.'), false);
      loadLong(longFromApp(json, payload));
    } catch (err) {
      status(err && err.message ? err.message : String(err), true);
      body.dataset.state = 'error';
    } finally {
      button.disabled = false;
    }
  }

  // ---------------------------------------------------------------- views and controls

  function setView(view, focusTab) {
    state.view = view;
    for (const tab of document.querySelectorAll('[role="tab"]')) {
      const on = tab.dataset.view === view;
      tab.setAttribute('aria-selected', String(on));
      tab.tabIndex = on ? 0 : -1;
      if (on && focusTab) tab.focus();
    }
    $('ak-head-view').hidden = view !== 'head';
    $('ak-model-view').hidden = view !== 'model';
    $('ak-matrix-view').hidden = view !== 'matrix';
    $('ak-rank-view').hidden = view !== 'rank';
    const isLong = view === 'long';
    $('ak-long-view').hidden = !isLong;
    document.querySelector('.ak-tabs').hidden = isLong;
    $('ak-reduce-field').hidden = !isLong;
    // The app's long view holds the one layer and head it was asked for.
    $('ak-head-field').hidden = !(view === 'matrix' || (isLong && !long.app));
    $('ak-topk-field').hidden = view !== 'head';
    $('ak-zoom-field').hidden = view !== 'matrix';
    $('ak-layer-field').hidden = view === 'model' || view === 'rank' || (isLong && Boolean(long.app));
    if (isLong) $('ak-section-field').hidden = true;
    hideTip();
    if (state.data || isLong) render();
    if (view === 'model') fetchEveryLayer();
  }

  // In the app, the model view is a grid of every layer: a text computed for fewer layers
  // is computed again for all of them when the server's limit allows it; otherwise the
  // request pickers offer ranges of layers that fit, and the page says so (it never sends a
  // request the server would refuse for its size).
  function fetchEveryLayer() {
    const note = $('ak-model-note');
    note.hidden = true;
    if (body.dataset.mode !== 'app' || !info || !state.data || $('ak-run').disabled) return;
    const m = info.models.find((x) => x.name === state.data.model);
    const picker = $('ak-req-layer');
    if (!m || m.name !== $('ak-model').value || picker.value === 'all' || dims(sec()).L >= depth(m)) return;
    const perLayer = requestWeightsPerLayer(m);
    const fit = Math.floor(info.max_weights / Math.max(1, perLayer));
    if (fit >= depth(m)) {
      picker.value = 'all';
      $('ak-app').requestSubmit();
      return;
    }
    const shownLayers = dims(sec()).L;
    if (fit >= 2) addLayerRanges(m, fit);
    note.textContent = 'This text was computed for ' + (shownLayers === 1 ? 'one layer' : shownLayers + ' layers') +
      ' of ' + depth(m) + '. ' + (fit >= 2
      ? 'All of them would be more weights than this server sends at once: choose a range of up to ' + fit +
        ' layers in Layers to compute, then Show attention.'
      : 'At this length the server sends one layer at a time: choose another layer in Layers to compute, or a shorter text.');
    note.hidden = false;
  }

  // Weights one layer of the last request counts against the server's limit: heads x
  // tokens^2 (an encoder-decoder: both stacks and cross-attention). Between words the
  // tokens are not in the data: a text's UTF-8 bytes and a few special tokens bound them.
  function requestWeightsPerLayer(m) {
    const heads = $('ak-req-head').value === 'all' ? m.heads : 1;
    const words = state.data.level !== 'token';
    const bound = (text) => new TextEncoder().encode(text).length + 4;
    const { self, encoder, decoder, cross } = state.data.sections;
    if (self) return heads * (words ? bound(state.data.text) : self.query_tokens.length) ** 2;
    const src = words ? bound(state.data.text) : (cross ? cross.key_tokens : encoder ? encoder.query_tokens : []).length;
    const tgt = words ? bound(state.data.target_text || '') : (cross ? cross.query_tokens : decoder ? decoder.query_tokens : []).length;
    return heads * (src * src + tgt * tgt + tgt * src);
  }

  // "layers 0-7", "layers 8-15", ...: options of the layer picker that the server accepts.
  function addLayerRanges(m, size) {
    const picker = $('ak-req-layer');
    for (const option of Array.from(picker.options)) if (option.value.includes('-')) option.remove();
    const after = picker.querySelector('option[value="all"]');
    let anchor = after.nextSibling;
    for (let a = 0; a < depth(m); a += size) {
      const b = Math.min(depth(m), a + size) - 1;
      if (b === a) continue; // a single layer has its own option
      picker.insertBefore(new Option('layers ' + a + '\u2013' + b, a + '-' + b), anchor);
    }
    picker.value = '0-' + (Math.min(depth(m), size) - 1);
  }

  function controls() {
    const tabs = Array.from(document.querySelectorAll('[role="tab"]'));
    for (const tab of tabs) {
      tab.addEventListener('click', () => setView(tab.dataset.view, false));
      tab.addEventListener('keydown', (e) => {
        const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
        if (!step) return;
        e.preventDefault();
        const next = tabs[(tabs.indexOf(tab) + step + tabs.length) % tabs.length];
        setView(next.dataset.view, true);
      });
    }
    $('ak-section').addEventListener('change', (e) => setSection(e.target.value, false));
    $('ak-layer').addEventListener('change', (e) => {
      state.layer = Number(e.target.value);
      state.cursor = null;
      if (state.view === 'long') longReset(true);
      render();
    });
    $('ak-head').addEventListener('change', (e) => {
      state.head = Number(e.target.value);
      if (state.view === 'long') longReset(false);
      render();
    });
    $('ak-reduce').addEventListener('change', (e) => { state.reduce = e.target.value; render(); });
    $('ak-topk').addEventListener('change', (e) => { state.topk = Number(e.target.value); render(); });
    $('ak-scale').addEventListener('change', (e) => { state.scale = e.target.value; render(); });
    $('ak-zoom').addEventListener('change', (e) => { state.zoom = Number(e.target.value); render(); });
    $('ak-rank-q').addEventListener('change', (e) => { state.rankQ = Number(e.target.value); render(); });
    $('ak-rank-k').addEventListener('change', (e) => { state.rankK = Number(e.target.value); render(); });
    $('ak-rank-rows').addEventListener('click', (e) => {
      const b = e.target.closest('.ak-rank-open');
      if (b) openRanked(b);
    });
    $('ak-pinned-rank').addEventListener('click', () => {
      state.rankQ = state.pinnedQ;
      $('ak-rank-q').value = String(state.pinnedQ);
      setView('rank', false);
    });
    document.addEventListener('keydown', releaseOnEscape);
    $('ak-pinned-clear').addEventListener('click', () => {
      state.pinnedQ = state.pinnedK = -1;
      showPinned();
    });
    $('ak-grid').addEventListener('mousemove', thumbTip);
    $('ak-grid').addEventListener('mouseleave', hideTip);
    $('ak-head-toggles').addEventListener('change', (e) => {
      state.headsOn[Number(e.target.dataset.index)] = e.target.checked;
      drawLines();
    });
    const setAll = (on) => {
      state.headsOn = state.headsOn.map(() => on);
      for (const box of document.querySelectorAll('#ak-head-toggles input')) box.checked = on;
      drawLines();
    };
    $('ak-heads-all').addEventListener('click', () => setAll(true));
    $('ak-heads-none').addEventListener('click', () => setAll(false));
    $('ak-grid').addEventListener('click', (e) => {
      const b = e.target.closest('.ak-thumb');
      if (!b) return;
      state.layer = Number(b.dataset.layer);
      state.head = Number(b.dataset.head);
      $('ak-layer').value = b.dataset.layer;
      $('ak-head').value = b.dataset.head;
      setView('matrix', false);
      $('ak-matrix').focus({ preventScroll: true });
    });
    tokenColumnEvents($('ak-queries'), 'q');
    tokenColumnEvents($('ak-keys'), 'k');
    $('ak-head-scroll').addEventListener('scroll', () => requestAnimationFrame(drawLines), { passive: true });
    matrixEvents();
    longEvents();
    let resizing = 0;
    window.addEventListener('resize', () => {
      clearTimeout(resizing);
      resizing = setTimeout(() => { if ((state.data || long) && state.view !== 'model') render(); }, 150);
    });
  }

  // ---------------------------------------------------------------- app mode

  let info = null;

  function status(message, error) {
    const el = $('ak-status');
    el.textContent = message;
    el.classList.toggle('ak-error', Boolean(error));
    el.setAttribute('role', error ? 'alert' : 'status');
  }

  // An encoder-decoder's layer indices run over its deeper stack; each stack takes those it has.
  const depth = (m) => Math.max(m.layers, m.decoder_layers || 0);

  function fillRequestPickers() {
    const m = info.models.find((x) => x.name === $('ak-model').value);
    const encoderDecoder = m.kind === 'encoder-decoder';
    $('ak-target-field').hidden = !encoderDecoder;
    $('ak-req-modes').closest('.ak-field').hidden = encoderDecoder;
    // A model with a chat template may read the text in it: turns and roles on the page.
    $('ak-chat-field').hidden = !m.chat_template;
    if (!m.chat_template) $('ak-chat').value = 'off';
    $('ak-text-label').textContent = encoderDecoder ? 'Source' : 'Text';
    const layers = $('ak-req-layer');
    layers.textContent = '';
    layers.add(new Option(encoderDecoder
      ? 'last layer of each stack (' + (m.layers - 1) + ' and ' + (m.decoder_layers - 1) + ')'
      : 'last layer (' + (m.layers - 1) + ')', 'last'));
    layers.add(new Option(encoderDecoder
      ? 'all layers (' + m.layers + ' encoder, ' + m.decoder_layers + ' decoder)'
      : 'all ' + m.layers + ' layers', 'all'));
    // Tagged as the view's layer picker tags them: "layer 5 · global", "layer 0 · local (512)".
    const kind = (n) => (!m.windows ? '' : m.windows[n] ? ' \u00b7 local (' + m.windows[n] + ')' : ' \u00b7 global');
    for (let n = 0; n < depth(m); n++) layers.add(new Option('layer ' + n + kind(n), String(n)));
    const heads = $('ak-req-head');
    heads.textContent = '';
    const headCount = Math.max(m.heads, m.decoder_heads || 0); // an encoder-decoder's stacks may differ
    heads.add(new Option('all ' + headCount + ' heads', 'all'));
    for (let n = 0; n < headCount; n++) heads.add(new Option('head ' + n, String(n)));
    if (body.dataset.state === 'empty') status(readyMessage(), false);
  }

  function readyMessage() {
    const m = info.models.find((x) => x.name === $('ak-model').value);
    return 'Choose Show attention for this example, or type a text of your own (at most ' + m.max_tokens + ' tokens for ' + m.name + ').';
  }

  async function submit(e) {
    e.preventDefault();
    if (!info) return;  // still asking the server what it serves
    const text = $('ak-text').value;
    if (!text.trim()) {
      status('Type a text first.', true);
      $('ak-text').focus();
      return;
    }
    // Words are whitespace and punctuation units of the text, aggregated by the server.
    const level = $('ak-level').value;
    const payload = { text, model: $('ak-model').value, level };
    const m = info.models.find((x) => x.name === payload.model);
    if ($('ak-chat').value === 'on' && m.chat_template) payload.chat = true;
    if (payload.chat && $('ak-long-mode').value === 'on') {
      status('The chat template is for full maps: choose Long text: off.', true);
      return;
    }
    if ($('ak-long-mode').value === 'on') {
      await submitLong(text, m);
      return;
    }
    if (m.kind === 'encoder-decoder' && $('ak-target').value.trim()) payload.decoder_text = $('ak-target').value;
    const layer = $('ak-req-layer').value;
    const head = $('ak-req-head').value;
    if (layer === 'last') {
      // An encoder-decoder's last layer is each stack's own last layer.
      payload.layers = m.kind === 'encoder-decoder' ? 'last' : [m.layers - 1];
    } else if (layer.includes('-')) {
      const [a, b] = layer.split('-').map(Number);
      payload.layers = Array.from({ length: b - a + 1 }, (_, n) => a + n);
    } else if (layer !== 'all') {
      payload.layers = [Number(layer)];
    }
    if (head !== 'all') payload.heads = [Number(head)];
    // Value-weighted and rollout maps come as sections of their own, in the Attention menu.
    if ($('ak-req-modes').value && m.kind !== 'encoder-decoder') payload.modes = $('ak-req-modes').value.split(',');
    const button = $('ak-run');
    button.disabled = true;
    body.dataset.state = 'loading';
    status('Computing attention\u2026', false);
    const started = performance.now();
    try {
      const response = await fetch('api/attention', {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(payload),
      });
      const json = await response.json().catch(() => null);
      if (!response.ok) {
        const detail = json && typeof json.detail === 'string' ? json.detail : response.statusText;
        status('Error ' + response.status + ': ' + detail, true);
        body.dataset.state = 'error';
        return;
      }
      const seconds = ((performance.now() - started) / 1000).toFixed(2);
      const first = Object.values(json.sections)[0];
      const unit = level === 'word' ? ' words' : ' tokens';
      status(json.kind === 'encoder-decoder'
        ? (json.generated ? 'No target given: the model wrote it by greedy decoding. ' : '') +
          encoderDecoderCounts(json, unit) + ' in ' + seconds + ' s.'
        : first.query_tokens.length + unit + ' in ' + seconds + ' s.', false);
      $('ak-error').hidden = true;
      load(json);
    } catch (err) {
      status('Request failed: ' + (err && err.message ? err.message : err), true);
      body.dataset.state = 'error';
    } finally {
      button.disabled = false;
    }
  }

  // A served model by the name the server knows it by, with the family of a model that
  // runs through transformers' attention interface (bridge:olmo2), as exported pages name it.
  function modelLabel(name) {
    const m = info && info.models.find((x) => x.name === name);
    return m && m.family.startsWith('bridge:') ? name + ' (' + m.family + ')' : name;
  }

  async function startApp() {
    // Take over the form before anything else: a submit that reached the browser would be
    // a navigation, which the content-security policy blocks.
    $('ak-app').addEventListener('submit', submit);
    $('ak-app').hidden = false;
    try {
      const response = await fetch('api/info');
      info = await response.json();
    } catch (err) {
      status('Could not reach the server: ' + (err && err.message ? err.message : err), true);
      body.dataset.state = 'error';
      return;
    }
    const select = $('ak-model');
    for (const m of info.models) {
      const layers = m.kind === 'encoder-decoder' ? m.layers + '+' + m.decoder_layers : String(m.layers);
      select.add(new Option(modelLabel(m.name) + ' (' + layers + ' layers, ' + m.heads + ' heads)', m.name));
    }
    select.value = info.default_model;
    select.addEventListener('change', fillRequestPickers);
    fillRequestPickers();
    $('ak-text').maxLength = info.max_chars;
    body.dataset.state = 'empty';
    status(readyMessage(), false);
  }

  // ---------------------------------------------------------------- start

  // Inside a notebook's frame: scroll areas get fixed heights (the frame's own height would
  // feed back into them), and the page tells the notebook how tall it is, so that a small
  // script beside the frame can fit the frame to it.
  if (window.parent !== window) {
    body.classList.add('ak-embedded');
    const report = () => {
      const bottom = body.getBoundingClientRect().bottom + parseFloat(getComputedStyle(body).marginBottom || '0');
      window.parent.postMessage({ attnkitHeight: Math.ceil(bottom + window.scrollY) }, '*');
    };
    new ResizeObserver(report).observe(body);
  }

  controls();
  setView('head', false);
  if (body.dataset.mode === 'app') {
    startApp();
  } else {
    try {
      load(JSON.parse($('attnkit-data').textContent));
    } catch (err) {
      fail(err);
    }
  }
})();
