%%% @doc When a port owner's (kem_port) pending calls time out: one timer
%%% per owner, not one per call.
%%%
%%% A timer per call (erlang:send_after, then cancel_timer on the reply)
%%% cost the owner ~0.23 us a call (docs/benchmarks.md, "BEAM CPU per call
%%% (issue 28)"), and the owner is the one process every call of its port
%%% passes through. Each pending call keeps its
%%% deadline (monotonic ms, or `infinity'); the timer is armed for the
%%% earliest one. When it fires, every call past its deadline is handed to
%%% kem_timeout (a probe of the port), its deadline set to `infinity' so it
%%% is handed over once, and the timer re-armed for the next deadline: a
%%% call times out when it did with a timer of its own.
-module(kem_port_deadline).

-export([of_timeout/1, arm/2, passed/1]).

%% The owner's state; this module reads `pending' (`Id => {From, Deadline,
%% Method, Shape}') and owns `timer' (`{At, TRef}' or `none').
-type owner() :: #{pending := map(), timer := {integer(), reference()} | none, atom() => term()}.

%% @doc A call's deadline: monotonic ms, or `infinity'. One ms more than
%% Timeout: the clock is read in whole ms, and a deadline of now + Timeout
%% can come up to 1 ms early (at `timeout => 1' a probe at once, before the
%% GPU thread is in the call); the timer it replaces never fired early.
-spec of_timeout(timeout()) -> integer() | infinity.
of_timeout(infinity) -> infinity;
of_timeout(Timeout) -> erlang:monotonic_time(millisecond) + Timeout + 1.

%% @doc Have the timer fire by Deadline.
-spec arm(integer() | infinity, owner()) -> owner().
arm(infinity, State) ->
    State;
arm(Deadline, State = #{timer := {At, _TRef}}) when At =< Deadline ->
    State;  % the common case: calls with one timeout come in deadline order
arm(Deadline, State = #{timer := Timer}) ->
    case Timer of
        {_At, Old} -> erlang:cancel_timer(Old, [{async, true}, {info, false}]);
        none -> ok
    end,
    State#{timer := {Deadline, erlang:start_timer(Deadline, self(), call_deadline, [{abs, true}])}}.

%% @doc The timer fired: hand every call past its deadline to kem_timeout.
-spec passed(owner()) -> {noreply, owner()} | {stop, term(), owner()}.
passed(State = #{pending := Pending}) ->
    Now = erlang:monotonic_time(millisecond),
    {Passed, Next} = maps:fold(fun(Id, {_From, Deadline, _Method, _Shape}, {Ids, Min}) when Deadline =< Now ->
                                       {[Id | Ids], Min};
                                  (_Id, {_From, Deadline, _Method, _Shape}, {Ids, Min}) ->
                                       {Ids, min(Deadline, Min)}  % an integer is less than `infinity'
                               end, {[], infinity}, Pending),
    Handed = lists:foldl(fun(Id, Acc) -> maps:update_with(Id, fun(Call) -> setelement(2, Call, infinity) end, Acc) end,
                         Pending, Passed),
    time_out(lists:sort(Passed), {noreply, arm(Next, State#{pending := Handed})}).

%% Each call past its deadline, oldest first, to kem_timeout; a stop (the
%% port is killed) ends the walk: terminate/2 answers the rest.
time_out([Id | Rest], {noreply, State = #{pending := Pending}}) when is_map_key(Id, Pending) ->
    time_out(Rest, kem_timeout:call_timed_out(Id, State));
time_out([_Id | Rest], NoReply = {noreply, _}) ->
    time_out(Rest, NoReply);
time_out(_Ids, Result) ->
    Result.
