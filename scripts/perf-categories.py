#!/usr/bin/env python3
"""Summarise a `perf script` dump of one latchkey process by component.

Usage: perf script -i perf.data > out.txt; scripts/perf-categories.py out.txt

A sample counts for a component when any frame of its stack starts with that component's path,
so the shares overlap (an openraft frame calling redb counts for both). "leaf" rows count only
the innermost frame. Used for the profiles in docs/PERFORMANCE.md (issue #11).
"""
import re,collections,sys
samples=[];cur=[]
for line in open(sys.argv[1]):
    if line.strip()=='' :
        if cur: samples.append(cur); cur=[]
        continue
    if line[0] in ' \t':
        p=line.strip().split(' ',1)
        if len(p)==2: cur.append(p[1].lstrip('<'))
n=len(samples)
def frac(pred): return 100*sum(1 for s in samples if pred(s))/n
def anyst(*ks): return lambda s: any(f.startswith(k) for f in s for k in ks)
print('n',n)
for name,p in [('malloc/free leaf',lambda s: any(k in s[0] for k in ('malloc','free','realloc','_int_','cfree','unlink_chunk'))),
 ('memmove leaf',lambda s: 'memmove' in s[0] or 'memcpy' in s[0]),
 ('prost', anyst('prost::','tonic_prost')),('postcard',anyst('postcard::')),('fdatasync',anyst('__GI_fdatasync','fdatasync')),
 ('redb',anyst('redb::')),('log_store',anyst('latchkey_log_store')),('RaftCore',anyst('openraft::core::raft_core')),('openraft any',anyst('openraft::')),
 ('sm worker',anyst('openraft::core::sm')),('replication',anyst('openraft::replication')),('peer',anyst('latchkey_server::peer')),
 ('service',anyst('latchkey_server::service')),('leases',anyst('latchkey_server::leases')),('node',anyst('latchkey_server::node')),
 ('state_machine',anyst('latchkey_raft::state_machine')),('table',anyst('latchkey_core::table')),('h2',anyst('h2::')),('hyper',anyst('hyper::','hyper_util')),('tonic',anyst('tonic::')),('HTTP/2 + gRPC (h2, hyper, tonic)',anyst('h2::','hyper::','hyper_util','tonic::')),
 ('tracing',anyst('tracing::','tracing_core','tracing_subscriber')),('kernel leaf',lambda s: 'kallsyms' in s[0]),('tokio park',anyst('tokio::runtime::scheduler::multi_thread::worker::Context::park')),
 ('tcp send/recv (kernel)',lambda s: any(k in f for f in s for k in ('tcp_sendmsg','tcp_recvmsg','sock_read_iter','sock_write_iter'))),('epoll',lambda s: any('epoll' in f for f in s))]:
    print(f'{frac(p):6.2f}% {name}')
