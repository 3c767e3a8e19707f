// The node peer of `make bench`: swarthy/redis-semaphore's Semaphore on ioredis.
//
//   node bench.js '<json>'     (benchmarks/peers.py builds the argument)
//
// Modes, each printing one JSON object on stdout:
//
// * {"mode": "cycles", "url", "limits": [1, 5], "rounds", "seconds"}: acquire+release
//   cycles/s of a Semaphore per limit, each run right after a half-length run of the
//   PING-pair floor on the same ioredis connection, in rotating order (as
//   benchmarks/common.py interleaved() does for the Python contenders); medians.
// * {"mode": "cpu", "url", "limit", "cycles", "rounds"}: Redis server CPU (INFO cpu,
//   used_cpu_sys + used_cpu_user) per PING pair and per acquire+release cycle, in
//   alternating batches of `cycles`; medians of the per-batch figures, in usec.
// * {"mode": "worker", "url", "key", "limit", "duration", "hold"}: one contended
//   process: connects, prints "ready", reads start_at (CLOCK_MONOTONIC seconds, the
//   clock of Python's time.monotonic()) from its stdin (or takes "start_at" from the
//   argument), then for `duration` s: acquire (waiting, the library's own retry loop
//   with its default retryInterval) -> hold `hold` s -> release; prints every
//   [requested, granted, released] triple on the same clock.
"use strict";

const Redis = require("ioredis");
const { Semaphore } = require("redis-semaphore");

const now = () => Number(process.hrtime.bigint()) / 1e9; // CLOCK_MONOTONIC, seconds
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

function connect(url) {
  return new Redis(url, { lazyConnect: false, maxRetriesPerRequest: 1 });
}

function semaphore(client, key, limit) {
  // lockTimeout 60 s: no lease expires during a run; the refresh timer (0.8 x
  // lockTimeout) never fires within a cycle.
  return new Semaphore(client, key, limit, { lockTimeout: 60000, acquireTimeout: 60000 });
}

async function rate(fn, seconds, batch = 25) {
  let count = 0;
  const start = now();
  const end = start + seconds;
  for (;;) {
    for (let i = 0; i < batch; i++) await fn();
    count += batch;
    const t = now();
    if (t >= end) return count / (t - start);
  }
}

async function cycles(args) {
  const client = connect(args.url);
  const floor = async () => {
    await client.ping();
    await client.ping();
  };
  const contenders = {};
  for (const limit of args.limits) {
    const sem = semaphore(client, `bench-node-cycles-${limit}-${process.pid}`, limit);
    contenders[`Semaphore, limit ${limit}`] = async () => {
      await sem.acquire();
      await sem.release();
    };
  }
  const names = Object.keys(contenders);
  for (const fn of [floor, ...Object.values(contenders)]) for (let i = 0; i < 200; i++) await fn();
  const rates = Object.fromEntries(names.map((n) => [n, []]));
  const relative = Object.fromEntries(names.map((n) => [n, []]));
  const floors = [];
  for (let r = 0; r < args.rounds; r++) {
    const shift = r % names.length;
    for (const name of [...names.slice(shift), ...names.slice(0, shift)]) {
      const f = await rate(floor, args.seconds / 2);
      floors.push(f);
      const x = await rate(contenders[name], args.seconds);
      rates[name].push(x);
      relative[name].push(x / f);
    }
  }
  client.disconnect();
  const peers = {};
  for (const name of names) peers[name] = { rate: median(rates[name]), vs_floor: median(relative[name]) };
  return { floor: median(floors), peers };
}

async function serverCpuUsec(client) {
  const text = await client.info("cpu");
  const field = (name) => Number(new RegExp(`^${name}:([\\d.]+)`, "m").exec(text)[1]);
  return (field("used_cpu_sys") + field("used_cpu_user")) * 1e6;
}

async function cpu(args) {
  const client = connect(args.url);
  const sem = semaphore(client, `bench-node-cpu-${process.pid}`, args.limit);
  const cycle = async () => {
    await sem.acquire();
    await sem.release();
  };
  const pingPair = async () => {
    await client.ping();
    await client.ping();
  };
  for (let i = 0; i < 200; i++) {
    await cycle();
    await pingPair();
  }
  const pings = [];
  const cyclesUsec = [];
  const above = [];
  for (let r = 0; r < args.rounds; r++) {
    const batch = async (fn) => {
      const before = await serverCpuUsec(client);
      for (let i = 0; i < args.cycles; i++) await fn();
      return ((await serverCpuUsec(client)) - before) / args.cycles;
    };
    let p, c;
    if (r % 2) {
      c = await batch(cycle);
      p = await batch(pingPair);
    } else {
      p = await batch(pingPair);
      c = await batch(cycle);
    }
    pings.push(p);
    cyclesUsec.push(c);
    above.push(c - p);
  }
  client.disconnect();
  return {
    limit: args.limit,
    ping_pair_usec: median(pings),
    cycle_usec: median(cyclesUsec),
    above_ping_usec: median(above),
  };
}

async function worker(args) {
  const client = connect(args.url);
  const sem = semaphore(client, args.key, args.limit);
  await sem.acquire(); // connected, script loaded: ready
  await sem.release();
  process.stdout.write("ready\n");
  const startAt = args.start_at ?? Number(await firstLine(process.stdin));
  const intervals = [];
  while (now() < startAt) await sleep(1);
  const end = startAt + args.duration;
  while (now() < end) {
    const requested = now();
    await sem.acquire();
    const granted = now();
    await sleep(args.hold * 1000);
    const released = now();
    await sem.release();
    intervals.push([requested, granted, released]);
  }
  client.disconnect();
  return { intervals };
}

function firstLine(stream) {
  return new Promise((resolve, reject) => {
    let text = "";
    stream.setEncoding("utf8");
    stream.on("data", (chunk) => {
      text += chunk;
      if (text.includes("\n")) {
        stream.pause();
        resolve(text.split("\n")[0]);
      }
    });
    stream.on("error", reject);
    stream.on("end", () => resolve(text));
  });
}

async function versions() {
  const read = (name) => require(`${name}/package.json`).version;
  return { "redis-semaphore": read("redis-semaphore"), ioredis: read("ioredis"), node: process.version };
}

async function main() {
  const args = JSON.parse(process.argv[2]);
  const modes = { cycles, cpu, worker };
  if (!modes[args.mode]) throw new Error(`unknown mode ${args.mode}`);
  const result = await modes[args.mode](args);
  result.versions = await versions();
  process.stdout.write(JSON.stringify(result) + "\n");
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
