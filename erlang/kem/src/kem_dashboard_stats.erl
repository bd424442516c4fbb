%%% @doc The dashboard's recent figures: calls, errors and latency per
%%% kernel over the last five minutes, in 10-second slots (docs/dashboard.md).
%%%
%%% `kem_metrics' keeps totals since the node started, by method; an
%%% operator asks which kernel is busy or slow *now*. So each finished call
%%% (`kem:checked_call' and `kem:counted', the one place every call ends)
%%% bumps one row `{{k, Kernel, Slot}, Calls, Errors, SumUs, Bucket...}' of
%%% a public ETS table, with `ets:update_counter/3' from the calling process:
%%% no message, 0.3 us a call. Latency goes into log-scale
%%% buckets, four per doubling (each bucket 19% wide, so a percentile read
%%% back is within 10% of the true one), from 1 us to 2^27 us (134 s);
%%% merged over the window they give p50/p90/p99.
%%%
%%% Bounded: at most `?MAX_KERNELS' (50) kernels are tracked at once, each
%%% admitted on its first *successful* call (a stranger's made-up ids fail
%%% with `kernel_not_found' or `invalid_kernel_id' and so never take a
%%% place); every other call is counted under `other'. A kernel with no
%%% call left in the window gives its place back. Rows older than the
%%% window are dropped every slot by this server, which owns the table
%%% (`kem_sup' starts it). 50 kernels x 30 slots x 112 counters is at most
%%% 1,500 rows, about 1.4 MB.
-module(kem_dashboard_stats).
-behaviour(gen_server).

-export([start_link/0, call_done/3, window/0, slot_seconds/0, window_slots/0, max_kernels/0]).
-export([percentile/2, bucket/1, slot/0, prune/1]).  % for kem_dashboard and the tests
-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).

-define(TABLE, ?MODULE).
-define(SLOT_S, 10).
%% 30 slots of 10 s: "the last minutes" of the issue, five of them.
-define(SLOTS, 30).
-define(MAX_KERNELS, 50).
%% Four buckets per doubling of the wall time in us, 2^0 .. 2^27 us.
-define(PER_DOUBLING, 4).
-define(BUCKETS, (27 * ?PER_DOUBLING)).
%% Row positions: key, calls, errors, summed us, then the buckets.
-define(CALLS, 2).
-define(ERRORS, 3).
-define(SUM_US, 4).
-define(BUCKET1, 5).
%% Chains' kernel lists are cut to this many bytes as keys: one key per
%% chain shape, not per chain length.
-define(MAX_KEY, 256).

-type kernel_window() :: #{kernel := binary() | other, calls := non_neg_integer(),
                           errors := non_neg_integer(), sum_us := non_neg_integer(),
                           series := [{non_neg_integer(), non_neg_integer()}],
                           buckets := [non_neg_integer()]}.
-export_type([kernel_window/0]).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

-spec slot_seconds() -> pos_integer().
slot_seconds() -> ?SLOT_S.

-spec window_slots() -> pos_integer().
window_slots() -> ?SLOTS.

-spec max_kernels() -> pos_integer().
max_kernels() -> ?MAX_KERNELS.

%% @doc One finished call of KernelId (`undefined' for calls that run no
%% kernel, not recorded) with its reply and wall time in us.
-spec call_done(binary() | undefined, term(), non_neg_integer()) -> ok.
call_done(KernelId, Reply, WallUs) when is_binary(KernelId), is_integer(WallUs) ->
    try record(KernelId, Reply, WallUs)
    catch error:badarg -> ok  % the app is not running: no table
    end;
call_done(_KernelId, _Reply, _WallUs) ->
    ok.

%% A kernel's row in this slot exists only if it is tracked, so the common
%% call is one update: 0.29 us a call (kem_metrics' own: 0.21 us; 0.50 us
%% with the place looked up first; OTP 25, docs/dashboard.md); the first
%% call of a slot also finds its place.
record(KernelId, Reply, WallUs) ->
    Slot = slot(),
    Failed = case Reply of {ok, _} -> 0; {ok, _, _} -> 0; _ -> 1 end,
    Ops = [{?CALLS, 1}, {?ERRORS, Failed}, {?SUM_US, WallUs}, {?BUCKET1 + bucket(WallUs), 1}],
    Key = key(KernelId),
    try ets:update_counter(?TABLE, {k, Key, Slot}, Ops)
    catch error:badarg -> update_row({k, tracked(Key, Failed), Slot}, Ops)
    end,
    Failed =:= 1 andalso bump({e, reason(Reply), Slot}),
    ok.

key(Id) when byte_size(Id) > ?MAX_KEY -> binary:part(Id, 0, ?MAX_KEY);
key(Id) -> Id.

reason({error, {Reason, _}}) when is_atom(Reason) -> Reason;
reason(_) -> internal.

%% The kernel's own row when tracked or admitted now, else `other'.
tracked(Kernel, Failed) ->
    case ets:member(?TABLE, {t, Kernel}) of
        true -> Kernel;
        false when Failed =:= 1 -> other;
        false -> admit(Kernel)
    end.

%% insert_new first: two callers admitting the same kernel count it once.
admit(Kernel) ->
    case ets:insert_new(?TABLE, {{t, Kernel}}) of
        false -> Kernel;
        true ->
            case ets:update_counter(?TABLE, tracked, 1, {tracked, 0}) =< ?MAX_KERNELS of
                true -> Kernel;
                false ->
                    ets:delete(?TABLE, {t, Kernel}),
                    ets:update_counter(?TABLE, tracked, -1),
                    other
            end
    end.

%% @doc The bucket (0-based) of a wall time in us: four per doubling.
-spec bucket(non_neg_integer()) -> non_neg_integer().
bucket(Us) when Us =< 1 -> 0;
bucket(Us) -> min(?BUCKETS - 1, trunc(?PER_DOUBLING * math:log2(Us))).

%% @doc The P-th percentile (0 < P =< 100) of bucket counts, in us: the
%% geometric middle of the bucket where the rank falls; `null' when empty.
-spec percentile(number(), [non_neg_integer()]) -> float() | null.
percentile(P, Buckets) ->
    case lists:sum(Buckets) of
        0 -> null;
        Total -> at_rank(max(1, ceil(P / 100 * Total)), Buckets, 0)
    end.

at_rank(Rank, [N | _], I) when Rank =< N -> math:pow(2, (I + 0.5) / ?PER_DOUBLING);
at_rank(Rank, [N | Rest], I) -> at_rank(Rank - N, Rest, I + 1);
at_rank(_Rank, [], I) -> math:pow(2, I / ?PER_DOUBLING).

%% @doc Every tracked kernel (and `other') over the window, with its
%% calls per slot oldest first (`{SlotAge, Calls}', 0 = the slot now
%% running), and the errors by reason over the window.
-spec window() -> #{kernels := [kernel_window()], errors := #{atom() => non_neg_integer()},
                    slot_elapsed_s := non_neg_integer()}.
window() ->
    Now = slot(),
    Rows = try ets:tab2list(?TABLE) catch error:badarg -> [] end,
    Recent = [R || R <- Rows, in_window(R, Now)],
    Kernels = lists:usort([K || Row <- Recent, {k, K, _} <- [element(1, Row)]]),
    Errors = lists:foldl(fun({{e, Reason, _}, N}, Acc) -> maps:update_with(Reason, fun(V) -> V + N end, N, Acc);
                            (_, Acc) -> Acc
                         end, #{}, Recent),
    #{kernels => [kernel_window(K, [R || R <- Recent, element(1, element(1, R)) =:= k,
                                        element(2, element(1, R)) =:= K], Now) || K <- Kernels],
      errors => Errors,
      slot_elapsed_s => erlang:monotonic_time(second) rem ?SLOT_S}.

in_window(Row, Now) ->
    case element(1, Row) of
        {k, _, Slot} -> Slot > Now - ?SLOTS;
        {e, _, Slot} -> Slot > Now - ?SLOTS;
        _ -> false
    end.

kernel_window(Kernel, Rows, Now) ->
    Sum = fun(Pos) -> lists:sum([element(Pos, R) || R <- Rows]) end,
    Buckets = [Sum(Pos) || Pos <- lists:seq(?BUCKET1, ?BUCKET1 + ?BUCKETS - 1)],
    Series = lists:sort([{Now - Slot, element(?CALLS, R)} || R <- Rows, {k, _, Slot} <- [element(1, R)]]),
    #{kernel => Kernel, calls => Sum(?CALLS), errors => Sum(?ERRORS), sum_us => Sum(?SUM_US),
      series => lists:reverse(Series), buckets => Buckets}.

%% @doc The slot now running (monotonic seconds / 10).
-spec slot() -> integer().
slot() -> erlang:monotonic_time(second) div ?SLOT_S.

update_row(Key, Ops) ->
    try ets:update_counter(?TABLE, Key, Ops)
    catch error:badarg ->
        %% The row's first call in this slot (no default row built on every
        %% call: a 112-tuple each time would cost more than the update).
        _ = ets:insert_new(?TABLE, list_to_tuple([Key | lists:duplicate(3 + ?BUCKETS, 0)])),
        ets:update_counter(?TABLE, Key, Ops)
    end.

bump(Key) ->
    ets:update_counter(?TABLE, Key, 1, {Key, 0}).

%%% gen_server: owns the table, drops old slots and idle kernels

init([]) ->
    _ = ets:new(?TABLE, [named_table, public, set, {write_concurrency, true}]),
    erlang:send_after(?SLOT_S * 1000, self(), prune),
    {ok, #{}}.

handle_call(_Msg, _From, State) -> {reply, ok, State}.
handle_cast(_Msg, State) -> {noreply, State}.

handle_info(prune, State) ->
    prune(slot()),
    erlang:send_after(?SLOT_S * 1000, self(), prune),
    {noreply, State};
handle_info(_Msg, State) ->
    {noreply, State}.

%% @doc Drop rows older than the window ending at slot Now, and give back
%% the place of each tracked kernel with no row left (every slot here;
%% tests call it with a later slot).
-spec prune(integer()) -> ok.
prune(Now) ->
    Oldest = Now - ?SLOTS,
    _ = ets:select_delete(?TABLE, [{list_to_tuple([{k, '_', '$1'} | lists:duplicate(3 + ?BUCKETS, '_')]),
                                    [{'=<', '$1', Oldest}], [true]},
                                   {{{e, '_', '$1'}, '_'}, [{'=<', '$1', Oldest}], [true]}]),
    Live = sets:from_list(ets:select(?TABLE, [{list_to_tuple([{k, '$1', '_'} | lists:duplicate(3 + ?BUCKETS, '_')]),
                                               [], ['$1']}])),
    Idle = [K || {{t, K}} <- ets:match_object(?TABLE, {{t, '_'}}), not sets:is_element(K, Live)],
    [begin ets:delete(?TABLE, {t, K}), ets:update_counter(?TABLE, tracked, -1) end || K <- Idle],
    ok.
