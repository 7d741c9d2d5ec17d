// How often a dropped connection is re-made on its own before the user is asked to step in.
// No `vscode` import.

export class RestartBudget {
  private readonly restarts: number[] = [];

  constructor(
    private readonly maxRestarts = 3,
    private readonly windowMs = 3 * 60_000,
    private readonly now: () => number = Date.now,
  ) {}

  /** Records a restart and says whether it fits: at most maxRestarts within windowMs. */
  allow(): boolean {
    const now = this.now();
    while (this.restarts.length > 0 && now - this.restarts[0] > this.windowMs) {
      this.restarts.shift();
    }
    if (this.restarts.length >= this.maxRestarts) {
      return false;
    }
    this.restarts.push(now);
    return true;
  }
}
