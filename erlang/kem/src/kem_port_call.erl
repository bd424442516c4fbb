%%% @doc A caller's side of a port owner (kem_port): check the request,
%%% call the owner, and when the owner was restarting or stopped before the
%%% call reached its port, wait briefly for the replacement and send the
%%% call again. Runs in the calling process; the owner never sees a call
%%% it cannot send.
%%%
%%% A call that finds no owner registered, or was still in the owner's
%%% mailbox when it stopped, waits for the replacement (at most its own
%%% timeout and `restart_wait', 500 ms) and is sent again, at most ?RESENDS
%%% times (a port killed again and again).
-module(kem_port_call).

-export([call/4, exit_error/1]).

-include("kem_port.hrl").
-define(RESENDS, 3).
-define(UNAVAILABLE, {error, {port_unavailable, <<"the port is restarting">>}}).

%% @doc Send one request and wait for its reply, at most Timeout ms.
-spec call(atom() | pid(), atom(), tuple(), timeout()) ->
    {ok, term()} | {error, kem_port:reason()}.
call(Server, Method, Args, Timeout)
        when is_atom(Server) orelse is_pid(Server), is_atom(Method), is_tuple(Args), ?IS_TIMEOUT(Timeout) ->
    Started = erlang:monotonic_time(millisecond),
    call_when_back({Server, Method, Args, Timeout, Started}, call_once(Server, Method, Args, Timeout), ?RESENDS);
call(_Server, _Method, _Args, _Timeout) ->
    {error, {bad_args, <<"call(Server, Method :: atom(), Args :: tuple(), Timeout :: 1..2^32-2001 | infinity)">>}}.

%% @doc What a caller hears when its owner stopped with Reason.
-spec exit_error(term()) -> kem_port:reason().
exit_error({shutdown, {port_exited, Status}}) -> {port_exited, exit_detail(Status)};
exit_error({shutdown, call_timeout}) ->
    {port_restarted, <<"another call on this port timed out; the port was restarted">>};
exit_error(Reason) -> {port_exited, Reason}.

%%% internals

%% The owner is restarting: wait for a new owner under the name (each time
%% at most `restart_wait', never past the call's own deadline), then send
%% the call again; at most ?RESENDS times (a port killed again and again).
call_when_back(Call = {Server, Method, Args, Timeout, Started}, {retry, Why, Old}, Left) when Left > 0 ->
    Cap = application:get_env(kem, restart_wait, 500),
    Wait = min(Cap, time_left(Timeout, Started, Cap)),
    case Wait > 0 andalso kem_spare:await(Server, Old, Wait) of
        ok ->
            Again = call_once(Server, Method, Args, time_left(Timeout, Started, infinity)),
            call_when_back(Call, Again, Left - 1);
        _ ->
            Why
    end;
call_when_back(_Call, {retry, Why, _Old}, 0) ->
    Why;
call_when_back(_Call, Result, _Left) ->
    Result.

time_left(infinity, _Started, Default) -> Default;
time_left(Timeout, Started, _Default) -> max(0, Timeout - (erlang:monotonic_time(millisecond) - Started)).

%% {retry, Error, OldOwner} when the call never reached a port and may be
%% sent again (Error is the answer if it cannot be): no owner registered,
%% ?RETRY from one that stopped, or an owner that stopped with the call
%% still unread (kem_port's terminate/2 answered every call it had sent).
call_once(Server, Method, Args, Timeout) ->
    case unsendable(Args) of
        false ->
            case owner(Server) of
                undefined -> {retry, ?UNAVAILABLE, undefined};
                Pid -> call_owner(Pid, Method, Args, Timeout)
            end;
        What ->
            %% The port refuses these (etf_guard) but cannot tell which
            %% caller sent them: the caller would wait out its timeout, and
            %% the timeout restart the port. Refused here, at once.
            {error, {bad_args, <<What/binary, " is not accepted in a request">>}}
    end.

%% A pid, port, reference or fun anywhere in Args (binaries are leaves).
%% A plain kernel call's `{Kernel, Input, Hint}' holds none: answered
%% without the walk (tuple_to_list and a clause per element, ~0.1 us).
unsendable({K, I, H}) when is_binary(K), is_binary(I), is_integer(H) -> false;
unsendable(T) when is_pid(T) -> <<"a pid">>;
unsendable(T) when is_port(T) -> <<"a port">>;
unsendable(T) when is_reference(T) -> <<"a reference">>;
unsendable(T) when is_function(T) -> <<"a fun">>;
unsendable(T) when is_tuple(T) -> unsendable_in(tuple_to_list(T));
unsendable(T) when is_list(T) -> unsendable_in(T);
unsendable(T) when is_map(T) -> unsendable_in(maps:keys(T) ++ maps:values(T));
unsendable(_) -> false.

unsendable_in([H | T]) ->
    case unsendable(H) of false -> unsendable_in(T); What -> What end;
unsendable_in(_) -> false.

owner(Pid) when is_pid(Pid) -> Pid;
owner(Name) -> whereis(Name).

call_owner(Pid, Method, Args, Timeout) ->
    %% The server answers at Timeout; the extra margin only guards against a
    %% server that is itself stuck (e.g. suspended on a busy port).
    Backstop = case Timeout of infinity -> infinity; _ -> Timeout + ?MARGIN_MS end,
    try gen_server:call(Pid, {call, Method, Args, Timeout}, Backstop) of
        ?RETRY -> {retry, {error, {port_restarted, <<"the port restarted before this call was served">>}}, Pid};
        Result -> Result
    catch
        exit:{noproc, _} ->
            {retry, ?UNAVAILABLE, Pid};
        exit:{{shutdown, _} = Stop, _} ->
            {retry, {error, exit_error(Stop)}, Pid};
        exit:{timeout, _} ->
            {error, {timeout, <<"the port owner did not answer in time">>}};
        exit:{Reason, _} ->
            %% Never format Reason: it can hold a caller's request, input
            %% binary and all, and 100 callers printing 4 MB each stall.
            {error, {port_unavailable, exit_summary(Reason)}}
    end.

exit_summary(Reason) when is_atom(Reason) ->
    <<"the port owner exited: ", (atom_to_binary(Reason, utf8))/binary>>;
exit_summary({Tag, _}) when is_atom(Tag) ->
    <<"the port owner exited: ", (atom_to_binary(Tag, utf8))/binary>>;
exit_summary(_) ->
    <<"the port owner exited">>.

%% Callers get a sentence, as for every other reason (docs/protocol.md).
exit_detail(output_closed) -> <<"the port process died (its output closed); the port is restarting">>;
exit_detail(Status) when is_integer(Status) -> <<"the port process exited with status ", (integer_to_binary(Status))/binary>>;
exit_detail(Why) when is_atom(Why) -> <<"the port process exited: ", (atom_to_binary(Why))/binary>>;
exit_detail(_) -> <<"the port process exited">>.
