%%% @doc Fair sharing: a kernel whose call timed out is quarantined.
%%%
%%% A call past its timeout costs its port a restart (`kill_on_timeout'),
%%% and every caller on that port an error. A runaway kernel sent again and
%%% again would take a port for a whole timeout each time, and two of them
%%% every port. So a kernel (by id) whose call timed out is refused at once,
%%% with reason `quarantined', for `quarantine_ms' (app env, default 60 s;
%%% 0 turns it off). The first call of a new runaway kernel still costs one
%%% timeout; its repeats cost nothing.
%%%
%%% A call that runs out of gas (`gas_exhausted', docs/metering.md) is not
%%% quarantined: the kernel ended on the GPU by the caller's budget, with no
%%% port killed and nothing lost for anyone else, and the same kernel with a
%%% larger budget is a legitimate call. Quarantine stays for timeouts, the
%%% last line of defence (a kernel slow without loops: a huge dispatch).
%%%
%%% An ETS table read by the callers themselves (no message on the hot
%%% path: one lookup per kernel call); this server only owns it.
-module(kem_quarantine).
-behaviour(gen_server).

-export([start_link/0, check/1, add/1, on_timeout/4]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).

-define(TABLE, ?MODULE).
-type key() :: binary() | {chain, binary()}.
%% Expired entries are dropped when the table grows past this many ids: an
%% attacker pays a whole timeout per entry, so it stays small.
-define(PRUNE_AT, 1000).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc `ok', or the refusal for a quarantined kernel: `KernelId' for
%% every use, `{chain, KernelId}' in chains only (a chain of several
%% kernels timed out, and which one ran away is unknown; kem.erl).
-spec check(key()) -> ok | {error, {quarantined, binary()}}.
check(Key) ->
    Now = now_ms(),
    try ets:lookup(?TABLE, Key) of
        [{_, Until}] when Until > Now ->
            {error, {quarantined, iolist_to_binary(
                io_lib:format("this kernel's last ~s timed out; it is refused~s for another ~b s",
                              [what(Key), where(Key), (Until - Now + 999) div 1000]))}};
        _ -> ok
    catch
        error:badarg -> ok  % the app is not running: nothing is quarantined
    end.

what({chain, _}) -> "chain";
what(_) -> "call".

where({chain, _}) -> " in chains";
where(_) -> "".

%% @doc Quarantine Key (as check/1 takes it) for `quarantine_ms' from now.
-spec add(key()) -> ok.
add(KernelId) ->
    case application:get_env(kem, quarantine_ms, 60000) of
        Ms when is_integer(Ms), Ms > 0 ->
            try
                ets:insert(?TABLE, {KernelId, now_ms() + Ms}),
                prune(ets:info(?TABLE, size))
            catch
                error:badarg -> ok
            end,
            ok;
        _ ->
            ok
    end.

prune(Size) when Size > ?PRUNE_AT ->
    Now = now_ms(),
    _ = ets:select_delete(?TABLE, [{{'_', '$1'}, [{'=<', '$1', Now}], [true]}]),
    ok;
prune(_) ->
    ok.

now_ms() -> erlang:monotonic_time(millisecond).

%% @doc Quarantine a timed-out call's kernel(s), Result passed through.
%% Only a kernel that outlived the full default timeout: a caller that asked
%% for less cannot get a kernel refused for everyone. Nor one whose call
%% only waited, for a fetch or in the queue (kem_timeout).
-spec on_timeout(term(), timeout(), timeout(), term()) -> term().
on_timeout(Kernels, Timeout, Default, {error, {timeout, _}} = Result) when is_list(Kernels) ->
    [on_timeout(K, Timeout, Default, Result) || K <- Kernels],
    Result;
on_timeout(Kernel, Timeout, Default, {error, {timeout, _}} = Result)
        when Kernel =/= none, is_integer(Timeout) ->
    case Timeout >= Default andalso kem_timeout:kernel_was_stuck(Result) of
        true -> ok = add(Kernel);
        false -> ok
    end,
    Result;
on_timeout(_Kernel, _Timeout, _Default, Result) ->
    Result.

init([]) ->
    _ = ets:new(?TABLE, [named_table, public, set, {read_concurrency, true}]),
    {ok, #{}}.

handle_call(_Request, _From, State) ->
    {reply, {error, {bad_args, <<"kem_quarantine takes no calls">>}}, State}.

handle_cast(_Msg, State) ->
    {noreply, State}.

handle_info(_Msg, State) ->
    {noreply, State}.
