// A two-tool agent on the OpenAI Agents SDK for JavaScript (@openai/agents) against a
// continuum server, over the Responses API (OpenAIResponsesModel) or Chat Completions
// (OpenAIChatCompletionsModel), plain or streamed. Prints ONE JSON line to stdout: the tools
// that ran with their arguments, the final output, the usage the SDK saw, and what went over
// the wire; on a failure the same line carries the error, the request and the server's answer,
// and the exit status is 1.
//
//   node agents_two_tools.mjs --base-url http://127.0.0.1:PORT/v1 --model M --api responses|chat
//                             [--stream]
//
// (or CONTINUUM_BASE_URL, CONTINUUM_MODEL, CONTINUUM_API, CONTINUUM_STREAM=1). The packages are
// resolved from this file's directory up, as ESM does (NODE_PATH is not consulted): run a copy
// placed next to the node_modules the packages were installed in.
//
// The choices mirror the Python Agents SDK tests (tests/server/test_responses_frameworks.py):
// toolChoice "required" with parallelToolCalls off makes each model turn exactly one call (the
// server enforces it with a grammar); once a tool ran, the next turn's toolChoice names the one
// that has not, and resetToolChoice off keeps the SDK from dropping to "auto" in between; a
// toolUseBehavior function ends the run once both ran; maxTurns caps it.
//
// Nothing may leave 127.0.0.1: tracing (which exports to api.openai.com) is disabled globally
// and per run, and every fetch or socket to another host is refused and reported.

import net from 'node:net';
import { parseArgs } from 'node:util';

import {
  Agent,
  OpenAIChatCompletionsModel,
  OpenAIResponsesModel,
  Runner,
  setTracingDisabled,
  tool,
} from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';

const INSTRUCTIONS = 'Use the tools, then answer in one short sentence.';
const WEATHER = 'sunny, 21 C';
const TIME = '14:05';
const MAX_TURNS = 4;
const QUESTION = 'What is the weather and the local time in Paris?';
const BOTH = ['get_time', 'get_weather'];

// --- nothing leaves loopback ------------------------------------------------------------------

const LOOPBACK = new Set(['127.0.0.1', '::1', '[::1]', 'localhost']);
const offline = [];

const realFetch = globalThis.fetch;
globalThis.fetch = async (input, init) => {
  const url = new URL(input instanceof Request ? input.url : String(input));
  if (!LOOPBACK.has(url.hostname)) {
    offline.push(`fetch ${url.origin}`);
    throw new Error(`network disabled: fetch ${url.origin}`);
  }
  return realFetch(input, init);
};

const realConnect = net.Socket.prototype.connect;
net.Socket.prototype.connect = function connect(...args) {
  // net.connect() passes its normalised [options, callback] as one array
  const first = Array.isArray(args[0]) ? args[0][0] : args[0];
  const opts = typeof first === 'object' && first !== null ? first : null;
  const host = opts
    ? opts.path === undefined
      ? (opts.host ?? 'localhost')
      : null
    : typeof args[1] === 'string'
      ? args[1]
      : 'localhost';
  if (host !== null && !LOOPBACK.has(host)) {
    offline.push(`connect ${host}`);
    throw new Error(`network disabled: connect ${host}`);
  }
  return realConnect.apply(this, args);
};

setTracingDisabled(true);

// --- what went over the wire ----------------------------------------------------------------

const wire = [];

async function recordingFetch(input, init) {
  const url = new URL(input instanceof Request ? input.url : String(input));
  const text = typeof init?.body === 'string' ? init.body : null;
  const entry = { method: init?.method ?? 'GET', path: url.pathname, body: null, status: null };
  if (text !== null) {
    try {
      entry.body = JSON.parse(text);
    } catch {
      entry.body = text;
    }
  }
  wire.push(entry);
  const response = await globalThis.fetch(input, init);
  entry.status = response.status;
  if (!response.ok) {
    entry.answer = await response.clone().text();
  }
  return response;
}

// --- the agent ------------------------------------------------------------------------------

function options() {
  const { values } = parseArgs({
    options: {
      'base-url': { type: 'string', default: process.env.CONTINUUM_BASE_URL },
      model: { type: 'string', default: process.env.CONTINUUM_MODEL },
      api: { type: 'string', default: process.env.CONTINUUM_API ?? 'responses' },
      stream: { type: 'boolean', default: process.env.CONTINUUM_STREAM === '1' },
    },
  });
  if (!values['base-url'] || !values.model || !['responses', 'chat'].includes(values.api)) {
    throw new Error('usage: --base-url URL --model MODEL --api responses|chat [--stream]');
  }
  return { baseURL: values['base-url'], model: values.model, api: values.api, stream: values.stream };
}

const city = z.object({ city: z.string() });

const getWeather = tool({
  name: 'get_weather',
  description: 'Current weather in a city.',
  parameters: city,
  execute: async ({ city }, ctx) => {
    ctx.context.ran.push({ name: 'get_weather', args: { city }, output: WEATHER });
    return WEATHER;
  },
});

const getTime = tool({
  name: 'get_time',
  description: 'Current local time in a city.',
  parameters: city,
  execute: async ({ city }, ctx) => {
    ctx.context.ran.push({ name: 'get_time', args: { city }, output: TIME });
    return TIME;
  },
});

function namesRan(ctx) {
  return new Set(ctx.context.ran.map((r) => r.name));
}

// The run ends once both tools ran, its final output made from their results.
function whenBothRan(ctx) {
  const ran = namesRan(ctx);
  if (BOTH.every((name) => ran.has(name))) {
    const summary = [...ctx.context.ran]
      .sort((a, b) => a.name.localeCompare(b.name))
      .map((r) => `${r.name}=${r.output}`)
      .join('; ');
    return { isFinalOutput: true, isInterrupted: undefined, finalOutput: summary };
  }
  return { isFinalOutput: false, isInterrupted: undefined };
}

function buildAgent(client, opts) {
  const model =
    opts.api === 'chat'
      ? new OpenAIChatCompletionsModel(client, opts.model)
      : new OpenAIResponsesModel(client, opts.model);
  const agent = new Agent({
    name: 'weather-and-time',
    instructions: INSTRUCTIONS,
    tools: [getWeather, getTime],
    model,
    modelSettings: {
      temperature: 0,
      maxTokens: 40,
      toolChoice: 'required',
      parallelToolCalls: false,
    },
    resetToolChoice: false,
    toolUseBehavior: whenBothRan,
  });
  // after a tool ran, the next turn's toolChoice names the tool that has not: the model writes
  // its arguments, the grammar fixes which tool it calls, and the tool list stays the same
  agent.on('agent_tool_end', (ctx) => {
    const ran = namesRan(ctx);
    const left = BOTH.filter((name) => !ran.has(name));
    if (left.length > 0) {
      agent.modelSettings = { ...agent.modelSettings, toolChoice: left[0] };
    }
  });
  return agent;
}

function usageJson(u) {
  return {
    requests: u.requests,
    input_tokens: u.inputTokens,
    output_tokens: u.outputTokens,
    total_tokens: u.totalTokens,
    input_tokens_details: u.inputTokensDetails,
    output_tokens_details: u.outputTokensDetails,
  };
}

async function main() {
  const opts = options();
  const client = new OpenAI({
    baseURL: opts.baseURL,
    apiKey: 'x',
    maxRetries: 0,
    timeout: 600_000,
    fetch: recordingFetch,
  });
  const runner = new Runner({ tracingDisabled: true });
  const context = { ran: [] };
  const agent = buildAgent(client, opts);
  let result;
  const events = [];
  if (opts.stream) {
    result = await runner.run(agent, QUESTION, { context, maxTurns: MAX_TURNS, stream: true });
    for await (const event of result) {
      if (event.type === 'raw_model_stream_event') {
        events.push(event.data.type);
      } else if (event.type === 'run_item_stream_event') {
        events.push(event.item.type);
      }
    }
    await result.completed;
    if (result.error) {
      throw result.error;
    }
  } else {
    result = await runner.run(agent, QUESTION, { context, maxTurns: MAX_TURNS });
  }
  return {
    api: opts.api,
    stream: opts.stream,
    ran: context.ran,
    final_output: result.finalOutput ?? null,
    completed: result.finalOutput !== undefined && result.interruptions.length === 0,
    new_items: result.newItems.map((item) => item.type),
    responses: result.rawResponses.map((r) => ({
      response_id: r.responseId ?? null,
      usage: usageJson(r.usage),
    })),
    usage: usageJson(result.runContext.usage),
    events,
    requests: wire.map(({ method, path, status, body }) => ({
      method,
      path,
      status,
      stream: body?.stream ?? false,
      tool_choice: body?.tool_choice ?? null,
    })),
    offline,
  };
}

try {
  process.stdout.write(`${JSON.stringify(await main())}\n`);
} catch (error) {
  const failed = wire.find((w) => w.status !== null && w.status >= 400) ?? wire.at(-1) ?? null;
  const report = {
    error: {
      name: error?.name,
      message: String(error?.message ?? error),
      cause: error?.cause === undefined ? null : String(error.cause?.message ?? error.cause),
      status: error?.status ?? null,
    },
    request: failed,
    requests: wire,
    offline,
  };
  process.stdout.write(`${JSON.stringify(report)}\n`);
  process.exitCode = 1;
}
