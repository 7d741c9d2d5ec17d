// How long to wait for a pause in typing before asking for a completion. Adaptive, after Tabby's
// debouncer: the wait scales with the user's own rhythm (the mean gap between their keystrokes,
// 100–400 ms) and is shorter where a completion is likely wanted (after a non-word character,
// at the end of a line or of the file); the server's recent response time is taken off it, so a
// slow server is asked a little earlier. No `vscode` import and no timers: the caller passes times.

export interface CursorSurroundings {
  /** The character just before the cursor ('' at the start of the file). */
  readonly charBefore: string;
  /** The rest of the cursor's line after it. */
  readonly lineAfter: string;
  /** Everything after the cursor. */
  readonly textAfter: string;
}

const GAP = { min: 100, max: 400, samples: 100, needed: 20 }; // ms; keystroke gaps kept and needed
const RATE = { min: 1.5, max: 3.0 }; // the wait in keystroke gaps: likely spots get the short one
const WAIT = { min: 100, max: 1000 }; // ms
const WEIGHTS = { charBefore: 0.5, lineEnd: 0.4, fileEnd: 0.1 };
const NOT_A_WORD = /^\W*$/;

export class AdaptiveDebounce {
  private gap = 200; // ms: the mean keystroke gap once enough are known
  private lastAt: number | undefined;
  private readonly gaps: number[] = [];

  /** The wait for a request at `now` (ms), given what surrounds the cursor and the last response time. */
  delay(now: number, around: CursorSurroundings, responseMs: number): number {
    this.record(now);
    const rate = RATE.max - (RATE.max - RATE.min) * likelihood(around);
    return clamp(WAIT.min, WAIT.max, rate * this.gap - responseMs);
  }

  private record(now: number): void {
    const gap = this.lastAt === undefined ? undefined : now - this.lastAt;
    this.lastAt = now;
    if (gap === undefined || gap > GAP.max) {
      return; // a pause, not a keystroke gap
    }
    this.gaps.push(gap);
    if (this.gaps.length > GAP.samples) {
      this.gaps.shift();
    }
    if (this.gaps.length >= GAP.needed) {
      this.gap = clamp(GAP.min, GAP.max, this.gaps.reduce((sum, value) => sum + value, 0) / this.gaps.length);
    }
  }
}

/** 0..1: how likely a completion is wanted here. */
export function likelihood(around: CursorSurroundings): number {
  let score = 0;
  score += NOT_A_WORD.test(around.charBefore) ? WEIGHTS.charBefore : 0;
  score += NOT_A_WORD.test(around.lineAfter) ? WEIGHTS.lineEnd : 0;
  score += NOT_A_WORD.test(around.textAfter) ? WEIGHTS.fileEnd : 0;
  return clamp(0, 1, score);
}

function clamp(min: number, max: number, value: number): number {
  return Math.max(min, Math.min(max, value));
}
