%%% @doc kem's counters and histograms, owned by the Erlang side so they
%%% survive port restarts (the Python port's own `stats' start at zero with
%%% every new process).
%%%
%%% One public ETS table, owned by this process (the first child of
%%% `kem_sup'); writers bump it with `ets:update_counter/4' from the calling
%%% process, so recording costs no message. Read it as Prometheus text with
%%% `kem:metrics/0'; inside a HyperBEAM node `kem_prometheus' exports the same
%%% table to the node's registry, so its `/metrics' shows it.
%%%
%%% What is kept: calls and their wall time by method (a histogram), errors
%%% by reason, kernel calls' bytes in and out, port starts and exits, and kernel
%%% fetch/verify failures (errors whose reason is one of
%%% the gateway reasons). GPU-side figures (queue depth, batch sizes, pool
%%% bytes) live in the port: `text/0' adds the live ports' values as gauges.
-module(kem_metrics).
-behaviour(gen_server).

-export([start_link/0, call_done/4, port_started/1, port_exited/2, group_sent/2,
         text/0, families/0, snapshot/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).

-type labels() :: [{binary(), binary()}].
-type family() ::
    {Name :: binary(), counter | gauge, Help :: binary(), [{labels(), number()}]}
    | {Name :: binary(), histogram, Help :: binary(),
       [{labels(), [{float() | inf, non_neg_integer()}], Count :: non_neg_integer(), SumSeconds :: float()}]}.
-export_type([family/0]).

-define(TABLE, kem_metrics).
%% How often to look for a Prometheus registry to join (kem_prometheus):
%% HyperBEAM starts prometheus with its HTTP server, after kem, so often at
%% first; then slowly, in case a restarted prometheus forgot kem.
-define(REGISTRY_LOOK_MS, 250).
-define(STATS_TIMEOUT_MS, 1000).
-define(REGISTRY_RECHECK_MS, 10000).
%% Seconds; kernel calls here run from ~50 us (inline ping) to seconds.
-define(BUCKETS, [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                  0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]).
%% The same in µs, compared with a call's integer wall time.
-define(BUCKETS_US, [100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
                     1000000, 2500000, 5000000, 10000000, 30000000]).
%% A method's row: `{{call, Method}, Calls, SumUs, BytesIn, BytesOut,
%% Bucket1..Bucket17, BucketInf}' (positions below).
-define(CALLS, 2).
-define(SUM_US, 3).
-define(BYTES_IN, 4).
-define(BYTES_OUT, 5).
-define(BUCKET1, 6).
-define(CALL_ROW(Key), list_to_tuple([Key | lists:duplicate(4 + 18, 0)])).
%% The methods that run kernels (kem:call/3's, run, session calls and
%% chains): the only ones whose bytes kem_bytes_in/out_total count.
-define(KERNEL_METHODS, [execute_kernel, execute_kernel_with_params, execute, run, session_call, chain]).
-define(FETCH_REASONS, [id_mismatch, bad_signature, data_root_mismatch, size_mismatch,
                        header_unavailable, bad_header, pin_mismatch,
                        unsupported_signature_type, fetch_failed, unreachable,
                        http_error, not_found, not_pinned, owner_not_allowed]).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc Record one finished call: its method, its result, its wall time in
%% microseconds and the bytes it carried in and out.
-spec call_done(atom(), {ok, term()} | {error, term()}, non_neg_integer(),
                {non_neg_integer(), non_neg_integer()}) -> ok.
call_done(Method, Result, WallUs, Bytes) ->
    %% Bytes only for kernel calls: an adapter_info reply (~800 bytes of
    %% JSON) or a config map is not a kernel's input or output.
    {BytesIn, BytesOut} = case lists:member(Method, ?KERNEL_METHODS) of
                              true -> Bytes;
                              false -> {0, 0}
                          end,
    %% One row per method, one update for all five figures (five updates
    %% cost ~0.7 us a call, docs/benchmarks.md "BEAM CPU per call").
    Ops = [{?CALLS, 1}, {?SUM_US, WallUs}, {?BYTES_IN, BytesIn}, {?BYTES_OUT, BytesOut},
           {?BUCKET1 + bucket(WallUs, ?BUCKETS_US, 0), 1}],
    update_row({call, Method}, Ops),
    case Result of
        {error, {Reason, _}} when is_atom(Reason) ->
            bump({errors, Reason}, 1),
            lists:member(Reason, ?FETCH_REASONS) andalso bump({fetch_failures, Reason}, 1),
            ok;
        {error, _} ->
            bump({errors, internal}, 1);
        _ ->
            ok
    end.

-spec port_started(atom()) -> ok.
port_started(Name) -> bump({port_starts, Name}, 1).

-spec port_exited(atom(), term()) -> ok.
port_exited(Name, _Why) -> bump({port_exits, Name}, 1).

%% @doc A port owner sent Calls calls as one group frame (kem_group).
-spec group_sent(atom(), pos_integer()) -> ok.
group_sent(Name, Calls) ->
    bump({group_frames, Name}, 1),
    bump({group_calls, Name}, Calls).

%% @doc Every counter as `{Key, Value}', for tests and collectors.
-spec snapshot() -> [{term(), integer()}].
snapshot() ->
    Rows = try ets:tab2list(?TABLE) catch error:badarg -> [] end,
    Calls = [Row || Row <- Rows, tuple_size(Row) > 2],  % the methods' rows
    [KV || {_, _} = KV <- Rows] ++ lists:append([call_counters(Row) || Row <- Calls]) ++
        [{bytes_in, lists:sum([element(?BYTES_IN, R) || R <- Calls])} || Calls =/= []] ++
        [{bytes_out, lists:sum([element(?BYTES_OUT, R) || R <- Calls])} || Calls =/= []].

%% A method's row as the counters it holds (buckets: those counted).
call_counters(Row) ->
    {call, Method} = element(1, Row),
    Buckets = lists:zip(?BUCKETS ++ [inf], lists:nthtail(?BUCKET1 - 1, tuple_to_list(Row))),
    [{{calls, Method}, element(?CALLS, Row)}, {{duration_sum_us, Method}, element(?SUM_US, Row)}
     | [{{duration_bucket, Method, Le}, N} || {Le, N} <- Buckets, N > 0]].

%% @doc The Prometheus text exposition format (version 0.0.4).
-spec text() -> binary().
text() ->
    kem_metrics_text:render(families()).


%% @doc Every metric, grouped as Prometheus families (cumulative buckets).
-spec families() -> [family()].
families() ->
    Snap = snapshot(),
    Sum = fun(Match) -> [{L, V} || {K, V} <- Snap, {ok, L} <- [Match(K)]] end,
    [{<<"kem_calls_total">>, counter, <<"Calls through kem, by method">>,
      Sum(fun({calls, M}) -> {ok, [{<<"method">>, to_bin(M)}]}; (_) -> no end)},
     {<<"kem_call_duration_seconds">>, histogram,
      <<"Wall time of a call as its caller saw it (queue, transfer, GPU)">>, histograms(Snap)},
     {<<"kem_errors_total">>, counter, <<"Failed calls, by reason">>,
      Sum(fun({errors, R}) -> {ok, [{<<"reason">>, to_bin(R)}]}; (_) -> no end)},
     {<<"kem_fetch_failures_total">>, counter, <<"Kernels that could not be fetched or verified, by reason">>,
      Sum(fun({fetch_failures, R}) -> {ok, [{<<"reason">>, to_bin(R)}]}; (_) -> no end)},
     {<<"kem_bytes_in_total">>, counter, <<"Input bytes sent to kernels">>,
      Sum(fun(bytes_in) -> {ok, []}; (_) -> no end)},
     {<<"kem_bytes_out_total">>, counter, <<"Result bytes returned by kernels">>,
      Sum(fun(bytes_out) -> {ok, []}; (_) -> no end)},
     {<<"kem_port_starts_total">>, counter, <<"Python port processes started (restarts included)">>,
      Sum(fun({port_starts, P}) -> {ok, [{<<"port">>, to_bin(P)}]}; (_) -> no end)},
     {<<"kem_port_exits_total">>, counter, <<"Python port processes that exited (crash, kill, timeout)">>,
      Sum(fun({port_exits, P}) -> {ok, [{<<"port">>, to_bin(P)}]}; (_) -> no end)},
     {<<"kem_group_frames_total">>, counter, <<"Group frames sent to a port (calls of one kernel, hint and input size)">>,
      Sum(fun({group_frames, P}) -> {ok, [{<<"port">>, to_bin(P)}]}; (_) -> no end)},
     %% Not kem_group_calls_total: that is the port groups' family (one
     %% group per adapter, kem_cluster_metrics), and a name may be one family only.
     {<<"kem_group_frame_calls_total">>, counter, <<"Calls sent to a port inside group frames">>,
      Sum(fun({group_calls, P}) -> {ok, [{<<"port">>, to_bin(P)}]}; (_) -> no end)}
     | port_families() ++ kem_cluster_metrics:families()].

histograms(Snap) ->
    Methods = lists:usort([M || {{duration_sum_us, M}, _} <- Snap]),
    [histogram(M, Snap) || M <- Methods].

histogram(Method, Snap) ->
    Counts = [{Le, proplists:get_value({duration_bucket, Method, Le}, Snap, 0)} || Le <- ?BUCKETS ++ [inf]],
    {Cumulative, Total} = lists:mapfoldl(fun({Le, N}, Acc) -> {{Le, Acc + N}, Acc + N} end, 0, Counts),
    SumUs = proplists:get_value({duration_sum_us, Method}, Snap, 0),
    {[{<<"method">>, to_bin(Method)}], Cumulative, Total, SumUs / 1.0e6}.

%% The live ports' integer figures (queue depth, pool bytes...), one family
%% per figure, labelled by port.
port_families() ->
    Gauges = port_gauges(),
    Keys = lists:usort([K || {K, _, _} <- Gauges]),
    [begin
         {Name, Type, Scale} = port_family(to_bin(K)),
         {Name, Type, <<"The port's own '", (to_bin(K))/binary, "' figure (since the port started)">>,
          [{[{<<"port">>, to_bin(P)}], V * Scale} || {K1, P, V} <- Gauges, K1 =:= K]}
     end || K <- Keys].

%% A port figure's family: Prometheus wants seconds, not the port's `_us'
%% (time summed since the port started: a counter, value / 1e6) or `_ms'
%% (uptime, timeouts: a gauge, value / 1e3); any other figure is a gauge
%% under its own name.
-spec port_family(binary()) -> {binary(), counter | gauge, number()}.
port_family(Key) ->
    Size = byte_size(Key) - 3,
    case Key of
        <<Base:Size/binary, "_us">> -> {<<"kem_port_", Base/binary, "_seconds_total">>, counter, 1.0e-6};
        <<Base:Size/binary, "_ms">> -> {<<"kem_port_", Base/binary, "_seconds">>, gauge, 1.0e-3};
        _ -> {<<"kem_port_", Key/binary>>, gauge, 1}
    end.

to_bin(A) when is_atom(A) -> atom_to_binary(A, utf8);
to_bin(B) when is_binary(B) -> B.

%%% gen_server: owns the table, joins a Prometheus registry when one appears

init([]) ->
    _ = ets:new(?TABLE, [named_table, public, set, {write_concurrency, true}]),
    self() ! join_registry,
    {ok, #{}}.

handle_call(_Msg, _From, State) -> {reply, ok, State}.
handle_cast(_Msg, State) -> {noreply, State}.

handle_info(join_registry, State) ->
    Next = case kem_prometheus:ensure_registered() of
        registered -> ?REGISTRY_RECHECK_MS;
        absent -> ?REGISTRY_LOOK_MS
    end,
    erlang:send_after(Next, self(), join_registry),
    {noreply, State};
handle_info(_Msg, State) ->
    {noreply, State}.

%%% internals

%% The index (0-based) of the smallest bucket that holds Us (the last,
%% `inf', past the last bound).
bucket(Us, [Le | _], I) when Us =< Le -> I;
bucket(Us, [_ | Rest], I) -> bucket(Us, Rest, I + 1);
bucket(_Us, [], I) -> I.

%% The row made on a method's first call (no default row built on every
%% call: a 23-tuple each time cost more than the four updates it saves).
update_row(Key, Ops) ->
    try ets:update_counter(?TABLE, Key, Ops), ok
    catch error:badarg ->
        try
            _ = ets:insert_new(?TABLE, ?CALL_ROW(Key)),
            _ = ets:update_counter(?TABLE, Key, Ops),
            ok
        catch error:badarg -> ok  % outside a started app: a no-op
        end
    end.

bump(Key, By) ->
    %% Outside a started app the table is absent: recording is a no-op then.
    try ets:update_counter(?TABLE, Key, By, {Key, 0}), ok
    catch error:badarg -> ok
    end.

%% Live port figures (integers only), as `{Name, Port, Value}'. A short
%% timeout: a scrape must not wait 30 s on a port busy with a long kernel.
port_gauges() ->
    case persistent_term:get({kem, ports}, undefined) of
        undefined -> [];
        {Names, _} ->
            [{Key, Port, V} || Port <- tuple_to_list(Names),
                               {ok, Stats} <- [kem_port:call(Port, stats, {}, ?STATS_TIMEOUT_MS)],
                               is_map(Stats),
                               {Key, V} <- maps:to_list(Stats), is_integer(V)]
    end.
