%%% @doc A freshly opened port's first words (kem_port): the handshake
%%% (ping, then which package and protocol it speaks, checked by
%%% kem_version) and the warm-up of the kernels its group served last.
%%% Runs inside the owner before any caller's request, with ReqIds the
%%% owner reserves; a port that fails here is closed and the owner's start
%%% fails with why.
-module(kem_port_start).

-export([handshake/1, warm/1, decode/1]).

%% What the owner hands in: its port, OS pid, name and next ReqId.
-type owner() :: #{port := port(), os_pid := integer() | undefined, name := atom(), next := integer(),
                   atom() => term()}.

%% @doc Fail fast, as erlexec does: the port must answer a ping (Python
%% opens the GPU device before reading its first frame), then say which
%% package and protocol it is, or the start fails with why. Log frames may
%% come first (kem_log); `{fatal, {Reason, Detail}}' is the port refusing
%% to start (an invalid setting): the start fails with `{Reason, Detail}'.
-spec handshake(owner()) -> ok | {stop, term()}.
handshake(State) ->
    Timeout = start_timeout(),
    case ask(State, ping, Timeout) of
        {ok, pong} ->
            case kem_version:check(ask(State, version, Timeout)) of
                ok -> ok;
                {error, Reason} -> close(State), {stop, Reason}
            end;
        output_closed ->
            close(State),
            {stop, {port_exited_at_start, output_closed}};
        {fatal, {Reason, Detail}} ->
            close(State),
            {stop, {Reason, Detail}};
        timeout ->
            close(State),
            {stop, {port_start_timeout, Timeout}};
        Other ->
            close(State),
            {stop, {bad_handshake, Other}}
    end.

%% @doc Warm the kernels the group served last (and the pinned ones) as
%% call `next' before saying ready; a failure only costs the first calls
%% their compile. A port that dies or stays silent here is closed.
-spec warm(owner()) -> ok | {stop, term()}.
warm(State = #{port := Port, next := Id, name := Name}) ->
    ok = warn_of_cpu(State),
    true = port_command(Port, term_to_binary({call, Id, warm, {kem_spare:shapes()}})),
    case await_warm(Port, Id, Name, start_timeout()) of
        ok -> ok;
        {stop, Reason} -> close(State), {stop, Reason}
    end.

%% @doc A frame of our own port as a term, or `{bad_frame, Frame}'. Not
%% `[safe]': the peer is our own port, whose replies carry a fixed set of
%% atoms (stats keys, error reasons) that this node may not know yet.
-spec decode(binary()) -> term().
decode(Frame) ->
    try binary_to_term(Frame)
    catch error:badarg -> {bad_frame, Frame}
    end.

%%% internals

%% The README promises a warning when kem runs on a CPU adapter (lavapipe:
%% every kernel runs, far slower). The port stays quiet when the node chose
%% its adapter, so the node says it: once per port group and app start,
%% by the group's first port to start (kem_sup's `cpu_warned' flags), with
%% the port's own reason. A spare (no group of its own) and a port whose
%% group has answered (1: warned, 2: a GPU) skip the question.
warn_of_cpu(State = #{name := Name}) ->
    case {kem_place:group_of(Name), persistent_term:get({kem, cpu_warned}, undefined)} of
        {G, Flags} when is_integer(G), Flags =/= undefined ->
            case atomics:get(Flags, G) of
                0 -> warn_of_cpu(State, G, Flags);
                _ -> ok
            end;
        _ ->
            ok
    end.

warn_of_cpu(State, G, Flags) ->
    case ask(State, health, start_timeout()) of
        {ok, #{kind := <<"cpu">>, reason := Reason}} ->  % the reason names the adapter
            case atomics:compare_exchange(Flags, G, 0, 1) of
                ok -> logger:warning("kem: port group ~b runs on a CPU adapter: ~ts", [G, Reason], #{kem_group => G});
                _ -> ok  % another port of the group warned first
            end;
        {ok, #{kind := _}} ->
            atomics:put(Flags, G, 2);  % a GPU: its later ports need not ask
        _ ->
            ok  % no answer: warm/1 and the callers will find out
    end.

start_timeout() ->
    application:get_env(kem, start_timeout, 60000).

%% One request before any caller's: ReqId 0, answered in order.
ask(State = #{port := Port}, Method, Timeout) ->
    true = port_command(Port, term_to_binary({call, 0, Method, {}})),
    await_answer(State, erlang:monotonic_time(millisecond) + Timeout).

await_answer(State = #{port := Port, name := Name}, Deadline) ->
    receive
        {Port, {data, Frame}} ->
            case decode(Frame) of
                {reply, 0, Result} -> Result;
                {fatal, _} = Fatal -> Fatal;
                Other ->
                    case kem_log:frame(Name, Other) of
                        true -> await_answer(State, Deadline);
                        false -> Other
                    end
            end;
        {Port, eof} ->
            output_closed
    after max(0, Deadline - erlang:monotonic_time(millisecond)) ->
        timeout
    end.

%% The warm reply; the port's log frames that come before it go to logger.
await_warm(Port, Id, Name, Timeout) ->
    receive
        {Port, {data, Frame}} ->
            case decode(Frame) of
                {reply, Id, {ok, _Counts}} -> ok;
                Other ->
                    case kem_log:frame(Name, Other) of
                        true -> await_warm(Port, Id, Name, Timeout);
                        false -> logger:warning("kem_port ~p: warm failed: ~0P", [Name, Other, 8]), ok
                    end
            end;
        {Port, eof} ->
            {stop, {port_exited_at_start, output_closed}}
    after Timeout ->
        {stop, {port_start_timeout, Timeout}}
    end.

close(#{port := Port, os_pid := OsPid}) ->
    kem_port_process:close_port(Port, OsPid, later).
