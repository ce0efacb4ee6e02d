"""Decision providers: Laya, Von, CLM (local, in worker processes) and Jev (hosted)."""
