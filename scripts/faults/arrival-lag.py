#!/usr/bin/env python3
"""How late a recording's GPU records reached the agent: for each <pid>.bin given (as the agent
wrote it, records in the order they arrived), every kernel, graph-launch and memory record's lag
behind the latest step marker or record end seen before it in the file, in seconds: count,
median, 90th percentile, largest. A lag near the recording's length means the records arrived
together at the end (CUPTI handed them over only at the job's exit flush); the live pipeline
settles iterations 1.5 s after they end, so it saw none of them.

    python3 scripts/faults/arrival-lag.py DIR/*/*.bin
"""
import struct, sys

for f in sorted(sys.argv[1:]):
    data=open(f,'rb').read(); off=0; clock=0; lags=[]
    while off+8<=len(data):
        kind,ver,ln=struct.unpack_from('<HHI',data,off)
        if ln<8: break
        t=None
        if kind in (0x0200,0x0201,0x0202):
            s,e=struct.unpack_from('<QQ',data,off+8); t=e
            if clock: lags.append(max(0,(clock-t))/1e9)
        elif kind==0x0300:
            step,ts=struct.unpack_from('<QQ',data,off+8); t=ts
        if t: clock=max(clock,t)
        off+=ln
    lags.sort()
    n=len(lags)
    print(f.split('/')[-2][:40].ljust(40), n, round(lags[n//2],2) if n else '-', round(lags[int(n*0.9)],2) if n else '-', round(lags[-1],2) if n else '-')
