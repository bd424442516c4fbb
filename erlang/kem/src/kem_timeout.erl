%%% @doc What a port owner does when a call outlives its timeout: ask the
%%% port where the call is before deciding anything.
%%%
%%% A call past its timeout may be waiting for a kernel fetch, waiting in
%%% the GPU queue behind other work, or running on the GPU. Only the last
%%% is a stuck GPU; killing the port for the others lost its compiled
%%% kernels and everyone else's calls. So when the timer fires the owner
%%% sends `{call, ProbeId, call_state, {Id}}' (answered on the port's
%%% reader thread, which never waits for the GPU) and:
%%% - `running': the GPU thread is inside that call: the caller gets
%%%   `{timeout, _}' and the port is killed (`kill_on_timeout');
%%% - `queued', `fetching', `unknown': the caller gets `{timeout, Detail}'
%%%   saying what it waited for, and the port stays (the port drops the
%%%   call itself when it reaches it: its deadline has passed);
%%% - no answer in `probe_timeout' ms (default 1000): the reader itself is
%%%   stuck (an inline call): treated as `running'.
%%% Asking costs nothing per call; a per-call "started on the GPU" notice
%%% would cost a frame per batch on the hot path for an event that is rare.
%%% The call's own reply, when it comes while the probe is out, still wins.
-module(kem_timeout).

-export([call_timed_out/2, probe_answered/3, probe_unanswered/2, kernel_was_stuck/1]).

-type state() :: map().

%% Details of a timeout that was not the kernel's doing: it waited (for a
%% fetch, in the queue) and its port was kept. The port's own answers and
%% `finish/4' below write them.
-define(PLACED, [execute_kernel, execute_kernel_with_params, execute]).
-define(NOT_STUCK, [<<"the port was kept">>, <<"waiting for the kernel fetch">>, <<"in the port's queue">>]).

%% @doc Whether a `{error, {timeout, Detail}}' means the kernel itself ran
%% past its time (kem_quarantine refuses it for a while), not a call that
%% only waited for a fetch or for other work.
-spec kernel_was_stuck({error, {timeout, binary()}}) -> boolean().
kernel_was_stuck({error, {timeout, Detail}}) when is_binary(Detail) ->
    binary:match(Detail, ?NOT_STUCK) =:= nomatch;
kernel_was_stuck(_) ->
    true.

%% @doc The timer of pending call Id fired: probe the port.
-spec call_timed_out(integer(), state()) -> {noreply, state()} | {stop, term(), state()}.
call_timed_out(Id, State = #{port := Port, next := ProbeId, probes := Probes}) ->
    try port_command(Port, term_to_binary({call, ProbeId, call_state, {Id}})) of
        true ->
            Grace = application:get_env(kem, probe_timeout, 1000),
            TRef = erlang:send_after(Grace, self(), {probe_timeout, ProbeId}),
            {noreply, State#{next := ProbeId + 1, probes := Probes#{ProbeId => {Id, TRef}}}}
    catch
        error:badarg -> finish(Id, <<"running">>, <<"the port is gone">>, State)
    end.

%% @doc The port said where the call is.
-spec probe_answered(integer(), term(), state()) -> {noreply, state()} | {stop, term(), state()}.
probe_answered(ProbeId, Result, State = #{probes := Probes}) ->
    {{Id, TRef}, Rest} = maps:take(ProbeId, Probes),
    _ = erlang:cancel_timer(TRef, [{async, true}, {info, false}]),
    case Result of
        {ok, #{state := Where, detail := Detail}} -> finish(Id, Where, Detail, State#{probes := Rest});
        _ -> finish(Id, <<"unknown">>, <<"the port could not say where the call is">>, State#{probes := Rest})
    end.

%% @doc The port did not answer the probe in time: its reader is stuck.
-spec probe_unanswered(integer(), state()) -> {noreply, state()} | {stop, term(), state()}.
probe_unanswered(ProbeId, State = #{probes := Probes}) ->
    case maps:take(ProbeId, Probes) of
        {{Id, _}, Rest} ->
            finish(Id, <<"running">>, <<"the port did not say where the call is; it is stuck">>,
                   State#{probes := Rest});
        error ->
            {noreply, State}
    end.

finish(Id, Where, Detail, State = #{pending := Pending}) ->
    case maps:take(Id, Pending) of
        {{From, _TRef, Method, _Shape}, Rest} ->
            %% The port places only plain kernel calls (intake); session
            %% work and chains run as GPU actions it cannot place, so for
            %% them the old rule holds: the GPU may be inside them.
            Stuck = Where =:= <<"running">> orelse not lists:member(Method, ?PLACED),
            Suffix = case Stuck andalso application:get_env(kem, kill_on_timeout, true) of
                true -> <<"; the port was restarted">>;
                false -> <<"; the port was kept">>
            end,
            Text = iolist_to_binary([atom_to_binary(Method), <<" did not finish in time: ">>, Detail, Suffix]),
            gen_server:reply(From, {error, {timeout, Text}}),
            case Stuck of
                true -> kem_port:maybe_kill(State#{pending := Rest}, Id);
                false -> {noreply, State#{pending := Rest}}
            end;
        error ->
            %% Its reply came while the probe was out and was delivered.
            {noreply, State}
    end.
