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
%%%   stuck (an inline call): the port is killed as for `running'.
%%% Only the first counts against the kernel (kem_quarantine, through
%%% `kernel_was_stuck/1'): with a stuck reader, the call whose timer fired
%%% first need not be the one holding it.
%%% Asking costs nothing per call; a per-call "started on the GPU" notice
%%% would cost a frame per batch on the hot path for an event that is rare.
%%% The call's own reply, when it comes while the probe is out, still wins.
-module(kem_timeout).

-export([call_timed_out/2, probe_answered/3, probe_unanswered/2, kernel_was_stuck/1]).

-type state() :: map().

%% Methods whose timeout may be the kernel's doing (kernel_was_stuck/1 reads
%% the method's name back from the text finish/5 wrote).
-define(KERNEL_METHODS, [execute_kernel, execute_kernel_with_params, execute, run, chain, session_call]).
%% Written by finish/5, and only there, into the timeout of a call the port
%% said the GPU was inside: the one timeout that is the kernel's doing.
-define(ON_GPU, <<" did not finish in time: it was running on the GPU: ">>).

%% @doc Whether a `{error, {timeout, Detail}}' means the kernel itself ran
%% past its time on the GPU (kem_quarantine refuses it for a while). Only
%% positive evidence counts: the port answered `running' for that very call
%% (chains and session work too: their GPU actions carry their ReqId). Not a call that waited for a fetch, for the GPU
%% queue or for its kernel's compile; not a probe left unanswered (the
%% reader is stuck, and which call holds it is unknown); not "the port
%% owner did not answer in time" (the owner was busy or suspended on a
%% full pipe: every caller of the port gets that, innocent or not).
-spec kernel_was_stuck({error, {timeout, binary()}}) -> boolean().
kernel_was_stuck({error, {timeout, Detail}}) when is_binary(Detail) ->
    case binary:match(Detail, ?ON_GPU) of
        {At, _} -> is_method(binary:part(Detail, 0, At));
        nomatch -> false
    end;
kernel_was_stuck(_) ->
    false.

%% The text before ?ON_GPU is the method's name (finish/5), never a port's
%% or a caller's words.
is_method(Name) ->
    lists:member(Name, [atom_to_binary(M) || M <- ?KERNEL_METHODS]).

%% @doc The timer of pending call Id fired: probe the port.
-spec call_timed_out(integer(), state()) -> {noreply, state()} | {stop, term(), state()}.
call_timed_out(Id, State = #{port := Port, next := ProbeId, probes := Probes}) ->
    try port_command(Port, term_to_binary({call, ProbeId, call_state, {Id}})) of
        true ->
            Grace = application:get_env(kem, probe_timeout, 1000),
            TRef = erlang:send_after(Grace, self(), {probe_timeout, ProbeId}),
            {noreply, State#{next := ProbeId + 1, probes := Probes#{ProbeId => {Id, TRef}}}}
    catch
        error:badarg -> finish(Id, <<"running">>, <<"the port is gone">>, State, guessed)
    end.

%% @doc The port said where the call is.
-spec probe_answered(integer(), term(), state()) -> {noreply, state()} | {stop, term(), state()}.
probe_answered(ProbeId, Result, State = #{probes := Probes}) ->
    {{Id, TRef}, Rest} = maps:take(ProbeId, Probes),
    _ = erlang:cancel_timer(TRef, [{async, true}, {info, false}]),
    case Result of
        {ok, #{state := Where, detail := Detail}} -> finish(Id, Where, Detail, State#{probes := Rest});
        _ -> finish(Id, <<"unknown">>, <<"the port could not say where the call is">>, State#{probes := Rest}, guessed)
    end.

%% @doc The port did not answer the probe in time: its reader is stuck.
-spec probe_unanswered(integer(), state()) -> {noreply, state()} | {stop, term(), state()}.
probe_unanswered(ProbeId, State = #{probes := Probes}) ->
    case maps:take(ProbeId, Probes) of
        {{Id, _}, Rest} ->
            finish(Id, <<"running">>, <<"the port did not say where the call is; it is stuck">>,
                   State#{probes := Rest}, guessed);
        error ->
            {noreply, State}
    end.

finish(Id, Where, Detail, State) ->
    finish(Id, Where, Detail, State, answered).

%% Answered: whether Where is the port's own answer (`answered') or the
%% owner's guess (`guessed': no answer, or no port).
finish(Id, Where, Detail, State = #{pending := Pending}, Answered) ->
    case maps:take(Id, Pending) of
        {{From, _TRef, Method, _Shape}, Rest} ->
            %% The port places every call, session work and chains
            %% included (their GPU actions carry their ReqId): only a call
            %% the GPU is inside, or a reader that did not answer, is stuck.
            Stuck = Where =:= <<"running">>,
            Suffix = case Stuck andalso application:get_env(kem, kill_on_timeout, true) of
                true -> <<"; the port was restarted">>;
                false -> <<"; the port was kept">>
            end,
            Verdict = case on_gpu(Where, Answered) of
                true -> ?ON_GPU;
                false -> <<" did not finish in time: ">>
            end,
            Text = iolist_to_binary([atom_to_binary(Method), Verdict, Detail, Suffix]),
            gen_server:reply(From, {error, {timeout, Text}}),
            case Stuck of
                true -> kem_port:maybe_kill(State#{pending := Rest}, Id);
                false -> {noreply, State#{pending := Rest}}
            end;
        error ->
            %% Its reply came while the probe was out and was delivered.
            {noreply, State}
    end.

%% The port itself said the GPU thread is inside the call.
on_gpu(<<"running">>, answered) -> true;
on_gpu(_Where, _Answered) -> false.
